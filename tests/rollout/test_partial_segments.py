"""Partial rollouts without an engine (`rlpost.rollout.partial`): the request that resumes a paused row (prompt +
its tokens, cap reduced), the splice of a segment's tokens with their version, and the final rollout output, all
traced by hand; and the partial-rollout counts of `staleness.partial_metrics`."""

import pytest
import torch

from rlpost import keys as K
from rlpost.protocol import DataProto
from rlpost.rollout import partial
from rlpost.trainer.ppo.staleness import partial_metrics, staleness_metrics

pytestmark = pytest.mark.timeout(30)

EOS, PAD = 2, 0


def _prompts():
    # row 0: prompt [5, 6]; row 1: prompt [7] (left-padded to P = 2)
    ids = torch.tensor([[5, 6], [PAD, 7]])
    mask = torch.tensor([[1, 1], [0, 1]])
    gen = DataProto.from_dict({K.INPUT_IDS: ids, K.ATTENTION_MASK: mask, K.POSITION_IDS: torch.tensor([[0, 1], [0, 0]])})
    gen.meta_info.update({K.META_EOS_TOKEN_ID: EOS, K.META_PAD_TOKEN_ID: PAD})
    return gen


def _engine_out(rows, width=4):
    """What an engine returns for ragged `rows` of (token, log-prob) pairs: right-padded responses and mask."""
    out = DataProto.from_dict({K.RESPONSES: torch.zeros(len(rows), width, dtype=torch.int64),
                               K.RESPONSE_MASK: torch.zeros(len(rows), width, dtype=torch.int64),
                               K.ROLLOUT_LOG_PROBS: torch.zeros(len(rows), width)})
    for j, row in enumerate(rows):
        for t, (tok, lp) in enumerate(row):
            out.batch[K.RESPONSES][j, t], out.batch[K.RESPONSE_MASK][j, t] = tok, 1
            out.batch[K.ROLLOUT_LOG_PROBS][j, t] = lp
    return out


def _two_segments():
    state = partial.start(_prompts(), response_length=4)
    req, rows = partial.request(state, tokens=2)  # segment 1, weights of version 0: two tokens per row
    assert rows == [0, 1] and [list(r) for r in req.non_tensor_batch[K.RESPONSE_CAPS]] == [[2], [2]]
    partial.splice(state, rows, _engine_out([[(11, -0.1), (12, -0.2)], [(13, -0.3), (EOS, -0.4)]]), [2, 2], 0)
    # row 1 ended on EOS; row 0 is paused after 2 tokens and resumed as prompt [5, 6, 11, 12], 2 tokens left
    req, rows = partial.request(state, tokens=None)
    assert rows == [0]
    assert [list(r) for r in req.non_tensor_batch[K.RAW_PROMPT_IDS]] == [[5, 6, 11, 12]]
    assert req.batch[K.INPUT_IDS].tolist() == [[5, 6, 11, 12]] and req.batch[K.POSITION_IDS].tolist() == [[0, 1, 2, 3]]
    assert [list(r) for r in req.non_tensor_batch[K.RESPONSE_CAPS]] == [[2]]
    partial.splice(state, rows, _engine_out([[(14, -0.5), (15, -0.6)]]), [2], 1)  # new weights: version 1
    return state


def test_a_paused_row_resumes_from_its_tokens_with_the_cap_reduced_and_keeps_each_tokens_version():
    out = partial.finish(_two_segments())
    assert out.batch[K.RESPONSES].tolist() == [[11, 12, 14, 15], [13, EOS, PAD, PAD]]
    assert out.batch[K.RESPONSE_MASK].tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]
    assert out.batch[K.ROLLOUT_POLICY_VERSIONS].tolist() == [[0, 0, 1, 1], [0, 0, -1, -1]]
    expected = torch.tensor([[-0.1, -0.2, -0.5, -0.6], [-0.3, -0.4, 0.0, 0.0]])
    assert torch.allclose(out.batch[K.ROLLOUT_LOG_PROBS], expected)
    assert out.batch[K.INPUT_IDS].tolist() == [[5, 6, 11, 12, 14, 15], [PAD, 7, 13, EOS, PAD, PAD]]
    assert out.batch[K.PROMPTS].tolist() == [[5, 6], [PAD, 7]]


def test_finish_refuses_unfinished_rows_and_a_finished_state_asks_the_engine_nothing():
    state = partial.start(_prompts(), response_length=4)
    with pytest.raises(ValueError, match="unfinished rows"):
        partial.finish(state)
    done = _two_segments()
    assert partial.request(done, tokens=None) == (None, [])


def test_partial_and_staleness_metrics_of_mixed_versions():
    versions = torch.tensor([[0, 0, 1, 1], [0, 0, -1, -1], [0, 1, 2, -1]])
    # row 0: 2 tokens resumed (version 1), 2 held at its pause; row 2: resumed twice, holding 1 then 2 tokens
    assert partial_metrics(versions) == {"fully_async/partial_samples": 2.0, "fully_async/resumed_tokens": 4.0,
                                         "fully_async/aborted_tokens": 5.0}
    m = staleness_metrics(versions, trained_version=2)
    # per token: 2 - version > 0 for 0,0,1,1 | 0,0 | 0,1 -> 8 stale of 9; rows lag by their oldest token: 2, 2, 2
    assert (m["fully_async/stale_tokens"], m["fully_async/stale_token_fraction"]) == (8.0, 8 / 9)
    assert m["fully_async/staleness_hist/2"] == 3.0
    assert partial_metrics(None)["fully_async/partial_samples"] == 0.0
