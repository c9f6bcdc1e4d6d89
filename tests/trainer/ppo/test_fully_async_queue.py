"""The fully asynchronous queue of `SplitRollouts` without Ray: weights pushed every k updates, the staleness
bound enforced by waiting or by dropping, a checkpoint with a held-back batch, and the staleness metrics. The
expected versions are traced by hand in each test's comment (stand-in groups from test_rollout_driver)."""

import pytest
import torch

from rlpost import keys as K
from rlpost.trainer.ppo.rollout_driver import SplitRollouts
from rlpost.trainer.ppo.staleness import staleness_metrics, token_versions
from tests.trainer.ppo.test_rollout_driver import ActorGroup, RolloutGroup, _gen_inputs, _prepare

pytestmark = pytest.mark.timeout(60)


def _driver(depth, every, bound, strategy, log):
    return SplitRollouts(ActorGroup(), RolloutGroup(log), depth, _prepare, _gen_inputs, sync_every=every,
                         bound=bound, strategy=strategy)


def _train(driver, n_batches, first_batch=0, first_step=1):
    """(policy version, staleness, dropped samples) of each step, checking each batch is its own prompts."""
    dicts = ({K.INPUT_IDS: torch.full((2, 3), i)} for i in range(first_batch, n_batches))
    seen = []
    for step, batch in enumerate(driver.batches(dicts), start=first_step):
        assert int(batch.batch[K.INPUT_IDS][0, 0]) == step - 1
        driver.generate(batch)
        driver.sync_weights({})
        m = driver.metrics(step)
        seen.append((m["training/policy_version"], m["training/policy_staleness"], m["fully_async/dropped_samples"]))
    return seen


def test_wait_holds_a_generation_back_until_it_would_be_within_the_bound():
    # depth 3, push every 2, bound 3: batches 1-4 are submitted with v0; batch 5 (4 - 0 > 3) waits for the push
    # after step 2 (v2), batch 6 follows it; batch 7 waits for v4; staleness 0,1,2,3,2,3,2,3 <= 3.
    log = []
    seen = _train(_driver(3, 2, 3, "wait", log), 8)
    assert [s[0] for s in seen] == [0, 0, 0, 0, 2, 2, 4, 4]
    assert [s[1] for s in seen] == [0, 1, 2, 3, 2, 3, 2, 3]
    assert all(s[2] == 0 for s in seen)
    gens = [e for e in log if e[0] == "gen"]
    assert [g[1] for g in gens] == list(range(1, 9))  # each generation seeded by the step it trains at
    assert [g[2] for g in gens] == [0, 0, 0, 0, 1, 1, 2, 2]  # weights the engine had: pushes received so far
    assert [e[0] for e in log[:6]] == ["gen"] * 4 + ["receive", "gen"]  # batch 5 only after the push of step 2


def test_drop_discards_a_batch_over_the_bound_and_generates_it_again_with_the_current_weights():
    # depth 2, push every update, bound 1: batches 1-3 generated with v0; step 3 finds batch 3 two versions old
    # (2 - 0 > 1): dropped, generated again with v2 (staleness 0); so for every later step.
    log = []
    seen = _train(_driver(2, 1, 1, "drop", log), 5)
    assert seen == [(0, 0, 0), (0, 1, 0), (2, 0, 2), (3, 0, 2), (4, 0, 2)]
    # batch k+2 is queued before batch k is taken, then batch k is generated again under its own seed
    assert [e[1] for e in log if e[0] == "gen"] == [1, 2, 3, 4, 5, 3, 4, 5]


def test_checkpoint_with_a_held_back_batch_resumes_to_the_same_versions(tmp_path):
    straight = _train(_driver(3, 2, 3, "wait", []), 8)
    first = _driver(3, 2, 3, "wait", [])
    it = first.batches({K.INPUT_IDS: torch.full((2, 3), i)} for i in range(8))
    for step in (1, 2, 3, 4):  # checkpoint at step 4 (a push): batches 5, 6, 7 queued, 5 and 6 generated
        first.generate(next(it))
        first.sync_weights({})
        first.metrics(step)
    first.save(str(tmp_path))
    resumed = _driver(3, 2, 3, "wait", [])
    resumed.load(str(tmp_path))
    resumed.set_version(4)
    assert _train(resumed, 8, first_batch=7, first_step=5) == straight[4:]


def test_staleness_metrics_count_rows_and_tokens_by_their_lag():
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1]])
    versions = torch.cat([token_versions(mask[:2], 3), token_versions(mask[2:], 5)])
    assert versions.tolist() == [[3, 3, -1], [3, -1, -1], [5, 5, 5]]
    m = staleness_metrics(versions, trained_version=5)
    # rows 0-1 lag by 2 (3 tokens, all stale), row 2 by 0
    assert m == {"fully_async/staleness_hist/0": 1.0, "fully_async/staleness_hist/2": 2.0,
                 "fully_async/max_staleness": 2.0, "fully_async/stale_tokens": 3.0,
                 "fully_async/stale_token_fraction": 0.5}
