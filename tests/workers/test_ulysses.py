"""Ulysses sequence parallelism on gloo ranks: log-probs, entropy and gradients with SP > 1 equal SP = 1's on the
same batch (float32, CPU: atol 1e-5 on values, 1e-5 relative on gradients), for GQA models with fewer KV heads
than the SP size, with gradient checkpointing, and through the FSDP2 workers (actor, reference, critic)."""

from __future__ import annotations

import pytest
import torch

from _fsdp_helpers import make_batch, spawn
from rlpost import keys

pytestmark = pytest.mark.timeout(300)

VOCAB = 96


def _model(heads: int, kv_heads: int, checkpointing: bool):
    """A 2-layer Qwen2 (head_dim 16), the same weights on every rank, SDPA attention."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=VOCAB, hidden_size=16 * heads, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=16,
                         tie_word_embeddings=True)
    model = Qwen2ForCausalLM(config)
    model.set_attn_implementation("sdpa")
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model.train()


def _values_and_grads(model, batch, sp):
    """Per-token (log-prob, entropy) (B, R, 2) of the responses and the gradient of a weighted sum of them."""
    from rlpost.workers.actor import forward_response_logits, token_logp_entropy

    model.zero_grad(set_to_none=True)
    both = forward_response_logits(model, batch, True, lambda lg, lb: token_logp_entropy(lg, lb, 0.7, True), sp)
    weights = torch.linspace(-1.0, 1.0, both.numel()).reshape(both.shape) * batch[keys.RESPONSE_MASK][..., None]
    (both * weights).sum().backward()
    return both.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def _forward_backward(rank: int, cases: list[tuple[int, int, int, bool]]) -> None:
    """Each case (heads, kv_heads, SP size, gradient checkpointing): SP values equal the single-rank ones, and
    the SP group's gradients, averaged as FSDP averages them, equal the single-rank gradients."""
    import torch.distributed as dist

    from rlpost.utils.distributed import init_distributed
    from rlpost.utils.ulysses import new_sequence_parallel, use_ulysses_attention

    init_distributed("cpu")
    batch = make_batch(VOCAB)
    for heads, kv_heads, size, checkpointing in cases:
        sp = new_sequence_parallel(size)
        model = _model(heads, kv_heads, checkpointing)
        want, want_grads = _values_and_grads(model, batch, None)
        use_ulysses_attention(model)
        got, grads = _values_and_grads(model, batch, sp)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        for name, grad in grads.items():
            dist.all_reduce(grad, group=sp.group)
            torch.testing.assert_close(grad / size, want_grads[name], atol=1e-6, rtol=1e-5, msg=name)


def test_two_ranks_match_single_rank(tmp_path):
    """The tiny model's layout (one KV head for two ranks), and 4 heads / 2 KV heads with checkpointing."""
    spawn(_forward_backward, ([(2, 1, 2, False), (4, 2, 2, True)],), str(tmp_path), world=2)


def test_four_ranks_match_single_rank(tmp_path):
    """SP 4 with 1 and 2 KV heads (repeated to 4), and two SP groups of 2 (data-parallel size 2)."""
    spawn(_forward_backward, ([(4, 1, 4, False), (4, 2, 4, True), (4, 2, 2, False)],), str(tmp_path), world=4)
