"""Partial rollouts in the fully asynchronous queue of `SplitRollouts`, without Ray: each queued generation
runs one token per row, is paused at every weight push and resumed with the new weights, and runs to its end
when its batch is trained; a checkpoint holding paused samples resumes to the same tokens. The stand-in engine
samples the token 10 + (the version of the weights it holds), so every token shows which weights produced it;
the versions are traced by hand in the comments."""

import pytest
import torch

from rlpost import keys as K
from rlpost.protocol import DataProto
from rlpost.rollout import partial
from rlpost.trainer.ppo.rollout_driver import SplitRollouts
from tests.trainer.ppo.test_rollout_driver import ActorGroup, Future, _prepare

pytestmark = pytest.mark.timeout(60)

R = 3  # response length: no EOS, every row runs to its cap


class PartialGroup:
    """Serves `generate_segment` in call order with `rlpost.rollout.partial`, as the rollout worker does."""

    world_size = 1

    def __init__(self, log, weights=0):
        self.log, self.weights = log, weights

    def generate_segment(self, state, version, tokens):
        state = state.get() if isinstance(state, Future) else state
        if not partial.is_state(state):
            state = partial.start(state, R)
        req, rows = partial.request(state, tokens)
        self.log.append(("segment", state.meta_info[K.META_GLOBAL_STEP], tokens, self.weights))
        if req is not None:
            caps = [int(c[0]) for c in req.non_tensor_batch[K.RESPONSE_CAPS]]
            n = len(rows)
            out = DataProto.from_dict({K.RESPONSES: torch.full((n, R), 10 + self.weights),
                                       K.RESPONSE_MASK: (torch.arange(R) < torch.tensor(caps)[:, None]).long(),
                                       K.ROLLOUT_LOG_PROBS: torch.full((n, R), -0.1 * (1 + self.weights))})
            partial.splice(state, rows, out, caps, version)
        return Future(state if tokens is not None else partial.finish(state))

    def receive_weights(self):
        self.weights += 1
        self.log.append(("receive", self.weights))
        return Future([0.0])


def _gen_inputs(batch, step=None):
    gen = DataProto.from_dict({K.INPUT_IDS: batch.batch[K.INPUT_IDS], K.ATTENTION_MASK: torch.ones_like(
        batch.batch[K.INPUT_IDS]), K.POSITION_IDS: torch.arange(3).expand(2, 3).clone()})
    gen.meta_info.update({K.META_GLOBAL_STEP: step, K.META_EOS_TOKEN_ID: 2, K.META_PAD_TOKEN_ID: 0})
    return gen


def _driver(group):
    # queue depth 2, a push after every update, bound 2 (wait), pause after each token
    return SplitRollouts(ActorGroup(), group, 2, _prepare, _gen_inputs, sync_every=1, bound=2, strategy="wait",
                         partial_tokens=1)


def _train(driver, n_batches, first_batch=0, first_step=1):
    """Per step: (row 0's tokens, its versions, the step's metrics)."""
    dicts = ({K.INPUT_IDS: torch.full((2, 3), 3 + i)} for i in range(first_batch, n_batches))
    seen = []
    for step, batch in enumerate(driver.batches(dicts), start=first_step):
        out = driver.generate(batch)
        driver.sync_weights({})
        seen.append((out.batch[K.RESPONSES][0].tolist(), out.batch[K.ROLLOUT_POLICY_VERSIONS][0].tolist(),
                     driver.metrics(step)))
    return seen


def test_queued_generations_pause_at_each_push_and_resume_with_the_new_weights():
    # b1-b3 start with v0 (one token each). Step 1 runs b1 to its end with v0; the push of v1 resumes b2, b3 by
    # one token; step 2 queues b4 (v1), runs b2 to its end with v1; push v2 resumes b3, b4; step 3 finds b3
    # complete ([0, 1, 2]); push v3 resumes b4, b5 ... so b_k (k >= 3) holds versions k-3, k-2, k-1.
    log = []
    seen = _train(_driver(PartialGroup(log)), 6)
    assert [s[1] for s in seen] == [[0, 0, 0], [0, 1, 1], [0, 1, 2], [1, 2, 3], [2, 3, 4], [3, 4, 5]]
    assert [s[0] for s in seen] == [[10 + v for v in s[1]] for s in seen]  # the engine's weights per token
    assert [s[2]["training/policy_version"] for s in seen] == [0, 0, 0, 1, 2, 3]  # its first token's
    # a row's staleness is its oldest token's: trained version (step - 1) minus it, within the bound 2
    assert [s[2]["fully_async/max_staleness"] for s in seen] == [0, 1, 2, 2, 2, 2]
    m3 = seen[2][2]  # b3: both rows [0, 1, 2] trained by v2: 2 of 3 tokens stale; resumed twice, held 1 then 2
    assert (m3["fully_async/stale_token_fraction"], m3["fully_async/partial_samples"]) == (2 / 3, 2.0)
    assert (m3["fully_async/resumed_tokens"], m3["fully_async/aborted_tokens"]) == (4.0, 6.0)
    assert seen[0][2]["fully_async/partial_samples"] == 0.0
    # the engine's call order: three first segments, b1 to its end, the push, then b2 and b3 resumed after it
    assert log[:7] == [("segment", 1, 1, 0), ("segment", 2, 1, 0), ("segment", 3, 1, 0), ("segment", 1, None, 0),
                       ("receive", 1), ("segment", 2, 1, 1), ("segment", 3, 1, 1)]


def test_checkpoint_holding_paused_samples_resumes_to_the_same_tokens(tmp_path):
    straight = _train(_driver(PartialGroup([])), 6)
    first = _driver(PartialGroup([]))
    it = first.batches({K.INPUT_IDS: torch.full((2, 3), 3 + i)} for i in range(6))
    for step in (1, 2):  # checkpoint after step 2's push: b3 and b4 are paused mid-response
        first.generate(next(it))
        first.sync_weights({})
        first.metrics(step)
    first.save(str(tmp_path))
    saved = torch.load(str(tmp_path / "rollout_inflight.pt"), weights_only=False)
    assert [item[3] for item in saved] == [True, True]  # both kept as paused states, not outputs
    assert saved[0][1].batch[K.ROLLOUT_POLICY_VERSIONS][0].tolist() == [0, 1, 2]
    assert saved[1][1].batch[K.ROLLOUT_POLICY_VERSIONS][0].tolist() == [1, 2, -1]
    resumed = _driver(PartialGroup([], weights=1))  # set_version's push brings the engine to the weights of v2
    resumed.load(str(tmp_path))
    resumed.set_version(2)
    again = _train(resumed, 6, first_batch=4, first_step=3)
    assert [s[:2] for s in again] == [s[:2] for s in straight[2:]]
    keys = ("training/policy_version", "fully_async/max_staleness", "fully_async/resumed_tokens")
    assert [[s[2][k] for k in keys] for s in again] == [[s[2][k] for k in keys] for s in straight[2:]]
