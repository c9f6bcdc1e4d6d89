"""`forward_response_logits` (LM head on response positions only) and `token_logp_entropy` against the
plain full-logits computation, on CPU with the tiny model."""

from __future__ import annotations

import pytest
import torch

from rlpost import keys
from rlpost.algos.logits import entropy_from_logits, logprobs_from_logits
from rlpost.workers.actor import _response_positions, forward_response_logits, token_logp_entropy
from _fsdp_helpers import make_batch


def test_token_logp_entropy_matches_reference_in_chunks():
    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(7, 11, generator=g) * 3).to(torch.bfloat16)
    labels = torch.randint(0, 11, (7,), generator=g)
    out = token_logp_entropy(logits, labels, temperature=0.7, with_entropy=True, chunk=3)
    z = logits.float() / 0.7
    assert out.shape == (7, 2) and out.dtype == torch.float32
    torch.testing.assert_close(out[:, 0], logprobs_from_logits(z, labels))
    torch.testing.assert_close(out[:, 1], entropy_from_logits(z))
    only = token_logp_entropy(logits, labels, temperature=0.7, chunk=4)
    assert only.shape == (7, 1)
    torch.testing.assert_close(only[:, 0], out[:, 0])


def test_token_logp_entropy_with_autograd_matches_and_has_the_reference_gradient():
    """Training goes through log_softmax, forward-only through logsumexp: same values, right gradient."""
    g = torch.Generator().manual_seed(1)
    base = torch.randn(9, 13, generator=g) * 3
    labels = torch.randint(0, 13, (9,), generator=g)
    weight = torch.randn(9, 2, generator=g)
    with torch.no_grad():
        no_grad = token_logp_entropy(base, labels, temperature=0.7, with_entropy=True, chunk=4)
    logits = base.clone().requires_grad_(True)
    out = token_logp_entropy(logits, labels, temperature=0.7, with_entropy=True, chunk=4)
    torch.testing.assert_close(out, no_grad)
    (out * weight).sum().backward()
    ref_logits = base.clone().requires_grad_(True)
    z = ref_logits / 0.7
    ref = torch.stack([logprobs_from_logits(z, labels), entropy_from_logits(z)], dim=-1)
    (ref * weight).sum().backward()
    torch.testing.assert_close(logits.grad, ref_logits.grad)


def test_response_positions_pick_real_tokens_before_each_response_token():
    mask = torch.tensor([[0, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1]])
    keep, grid = _response_positions(mask, r=3)
    # positions 2..4 predict the 3 response tokens; row 0's position 5 is pad (not a predicting one anyway)
    assert grid.tolist() == [2, 3, 4, 8, 9, 10]
    assert keep.tolist() == [1, 2, 3, 6, 7, 8]  # row 0 has 4 real tokens, packed first


class _NoKeep(torch.nn.Module):
    """A model whose forward has no `logits_to_keep` (like a token-classification critic)."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, input_ids, attention_mask=None, position_ids=None, use_cache=False):
        return self.inner(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                          use_cache=use_cache)


@pytest.mark.parametrize("rmpad", [False, True])
def test_head_on_response_positions_equals_full_logits(tiny_model_dir, rmpad):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    mb = make_batch(model.config.vocab_size)

    def fn(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return token_logp_entropy(logits, labels, 0.7, with_entropy=True)

    with torch.no_grad():
        fast = forward_response_logits(model, mb, rmpad, fn)
        full = forward_response_logits(_NoKeep(model), mb, rmpad, fn)
        padded = forward_response_logits(_NoKeep(model), mb, False, fn)
    assert fast.shape == (8, 5, 2)
    real = mb[keys.RESPONSE_MASK].bool()
    torch.testing.assert_close(fast[real], full[real], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(fast[real], padded[real], atol=1e-4, rtol=1e-4)
