"""Entropy and log-probs from logits against hand-computed values."""

import math

import pytest
import torch

from rlpost import algos as ca


def _close(actual, expected, atol=1e-5):
    # torch.allclose rather than torch.testing.assert_close: the latter costs seconds on first use
    expected = torch.as_tensor(expected, dtype=actual.dtype)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert torch.allclose(actual, expected, atol=atol, rtol=0), (actual, expected)


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
