"""Masked reductions, entropy / log-probs from logits and PF-PPO resampling."""

import math
from types import SimpleNamespace

import pytest
import torch

from rlpost import keys
from rlpost.trainer.ppo import core_algos as ca
from rlpost.trainer.ppo.pf_ppo import pf_ppo_weights


def _close(actual, expected, atol=1e-5):
    # torch.allclose rather than torch.testing.assert_close: the latter costs seconds on first use
    expected = torch.as_tensor(expected, dtype=actual.dtype)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert torch.allclose(actual, expected, atol=atol, rtol=0), (actual, expected)


def test_masked_reductions_ignore_masked_garbage():
    values = torch.tensor([1.0, 2.0, 3.0, float("nan")])
    mask = torch.tensor([1.0, 1.0, 1.0, 0.0])
    _close(ca.masked_sum(values, mask), 6.0)
    _close(ca.masked_mean(values, mask), 2.0)
    _close(ca.masked_var(values, mask), 1.0)  # ((-1)^2 + 0 + 1^2) / (3 - 1)
    _close(ca.masked_var(values, mask, unbiased=False), 2 / 3)
    _close(ca.masked_whiten(values, mask)[:3], [-1.0, 0.0, 1.0], atol=1e-4)
    _close(ca.masked_whiten(values, mask, shift_mean=False)[:3], [1.0, 2.0, 3.0], atol=1e-4)
    rows = torch.tensor([[1.0, 3.0], [5.0, 7.0]])
    _close(ca.masked_mean(rows, torch.tensor([[1.0, 1.0], [1.0, 0.0]]), axis=-1), [2.0, 5.0])
    _close(ca.masked_mean(rows, torch.zeros(2, 2)), 0.0)  # nothing valid: 0, not nan


def test_entropy_from_logits_by_hand():
    # uniform over 2 -> ln 2; p = [0.25, 0.75] -> -(0.25 ln 0.25 + 0.75 ln 0.75)
    logits = torch.tensor([[[0.0, 0.0], [0.0, math.log(3.0)]]])
    expected = [[math.log(2.0), -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))]]
    _close(ca.entropy_from_logits(logits), expected)
    _close(ca.entropy_from_logits_with_chunking(logits, chunk_size=1), expected)
    big = torch.randn(3, 5, 7)
    _close(ca.entropy_from_logits_with_chunking(big, chunk_size=4), ca.entropy_from_logits(big))
    assert ca.entropy_from_logits_with_chunking(big, chunk_size=4).shape == (3, 5)


def test_logprobs_from_logits_by_hand():
    logits = torch.tensor([[[0.0, math.log(3.0)], [0.0, math.log(3.0)]]])
    labels = torch.tensor([[1, 0]])
    out = ca.logprobs_from_logits(logits, labels, chunk_size=1)
    _close(out, [[math.log(0.75), math.log(0.25)]])
    out_bf16 = ca.logprobs_from_logits(logits.to(torch.bfloat16), labels)
    assert out_bf16.dtype == torch.float32 and out_bf16.shape == (1, 2)
    with pytest.raises(ValueError, match="disagree"):
        ca.logprobs_from_logits(logits, torch.tensor([1, 0]))


def test_logprobs_gradient_matches_softmax_identity():
    # d log p_y / d z = onehot(y) - softmax(z): for z = [0, ln 3], y = 1 -> [-0.25, 0.25]
    logits = torch.tensor([[[0.0, math.log(3.0)]]], requires_grad=True)
    ca.logprobs_from_logits(logits, torch.tensor([[1]])).sum().backward()
    _close(logits.grad, [[[-0.25, 0.25]]])


def test_pf_ppo_weights():
    _close(pf_ppo_weights(torch.tensor([1.0, -2.0, 0.0]), "pow", 2.0), [1.0, 4.0, 0.0])
    _close(pf_ppo_weights(torch.tensor([1.0, 3.0, 2.0, 3.0]), "max_min"), [1.0, 1.0, 0.0, 1.0])
    _close(pf_ppo_weights(torch.tensor([1.0, 3.0, 2.0]), "max_random"), [0.1, 0.4, 0.1])
    with pytest.raises(ValueError, match="reweight_method='best' is invalid"):
        pf_ppo_weights(torch.tensor([1.0]), "best")


def test_pf_ppo_sample_indices():
    gen = torch.Generator().manual_seed(0)
    idx = ca.pf_ppo_sample_indices(torch.tensor([1.0, 3.0, 2.0, 3.0] * 8), "max_min", generator=gen)
    assert idx.dtype == torch.long and idx.shape == (32,)
    assert set((idx % 4).tolist()) <= {0, 1, 3}  # rows with score 2 have weight 0
    uniform = ca.pf_ppo_sample_indices(torch.zeros(6), "pow", generator=gen)  # all weights 0 -> uniform
    assert uniform.shape == (6,) and int(uniform.min()) >= 0 and int(uniform.max()) <= 5


def test_compute_pf_ppo_reweight_data_uses_sequence_scores():
    picked = {}
    data = SimpleNamespace(
        batch={keys.TOKEN_LEVEL_SCORES: torch.tensor([[0.0, 0.0], [0.0, 1.0], [2.0, 0.0]])},
        select_idxs=lambda idx: picked.setdefault("idx", idx),
    )
    out = ca.compute_pf_ppo_reweight_data(data, "pow", 1.0, generator=torch.Generator().manual_seed(0))
    assert out is picked["idx"] and out.shape == (3,)
    assert 0 not in out.tolist()  # row 0 scores 0 -> weight 0
