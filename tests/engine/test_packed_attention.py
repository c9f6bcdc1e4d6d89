"""Packed attention without a dense mask: values and gradients equal the masked/padded paths; the kernel choice."""

from __future__ import annotations

import pytest
import torch

from rlpost import keys
from _batches import varied_batch
from rlpost.engine import packed_attention as pa
from rlpost.workers.actor import forward_response_logits, token_logp_entropy

pytestmark = pytest.mark.timeout(60)


def _block_causal_reference(q, k, v, lens):
    """Dense block-diagonal causal mask + SDPA: the path packed attention replaces. q (H, N, D) -> (N, H, D)."""
    n = q.shape[1]
    seq = torch.repeat_interleave(torch.arange(len(lens)), torch.tensor(lens))
    allowed = (seq[:, None] == seq[None, :]) & torch.ones(n, n, dtype=torch.bool).tril()
    rep = q.shape[0] // k.shape[0]
    k, v = k.repeat_interleave(rep, 0), v.repeat_interleave(rep, 0)
    return torch.nn.functional.scaled_dot_product_attention(q[None], k[None], v[None], attn_mask=allowed)[0] \
        .transpose(0, 1)


def test_attend_packed_equals_block_mask_with_gqa_values_and_grads():
    g = torch.Generator().manual_seed(0)
    lens = [3, 1, 5, 2]
    n = sum(lens)
    q = torch.randn(4, n, 8, generator=g, requires_grad=True)
    k = torch.randn(2, n, 8, generator=g, requires_grad=True)
    v = torch.randn(2, n, 8, generator=g, requires_grad=True)
    seqs = pa.packed_sequences(torch.tensor([3, 0, 1, 5, 2]), "cpu")  # a zero-length row is dropped
    assert seqs.bounds == (0, 3, 4, 9, 11) and seqs.max_len == 5 and seqs.cu_seqlens.dtype == torch.int32
    out = pa.attend_packed(q, k, v, seqs)
    w = torch.randn(out.shape, generator=g)
    grads = torch.autograd.grad((out * w).sum(), (q, k, v))
    ref = _block_causal_reference(q, k, v, lens)
    ref_grads = torch.autograd.grad((ref * w).sum(), (q, k, v))
    assert out.shape == (n, 4, 8)
    torch.testing.assert_close(out, ref, atol=1e-6, rtol=1e-5)
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)


def test_kernel_choice_and_layout_from_position_ids():
    kernel, causal, _, _ = pa._varlen_kernel()
    if kernel is not None:  # torch >= 2.10; the causal keyword follows the installed signature
        assert causal in ({"window_size": (-1, 0)}, {"is_causal": True})
    q = torch.zeros(2, 4, 8, dtype=torch.bfloat16)
    assert not pa.varlen_available(q, 0.0)  # CPU: the per-sequence SDPA loop
    seqs = pa._sequences_from_positions(torch.tensor([[0, 1, 2, 0, 0, 1]]), 6)
    assert seqs is not None and seqs.bounds == (0, 3, 4, 6)
    assert pa._sequences_from_positions(torch.tensor([[0, 1, 2]]), 3) is None  # one sequence: plain causal
    assert pa.mask_unless_packed(batch_size=1, q_length=4, kv_length=4, attention_mask=None) is None


@pytest.mark.parametrize("use_kwarg", [True, False])
def test_packed_model_log_probs_entropy_and_grads_equal_padded(tiny_model_dir, monkeypatch, use_kwarg):
    """A tiny Qwen2 on the packed path (no mask built) gives the padded path's values and parameter gradients;
    without the `packed_seqs` keyword the sequences are found from the position ids."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    padded_model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    packed_model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    pa.use_packed_attention(packed_model)
    assert packed_model.config._attn_implementation == pa.ATTENTION_NAME
    calls = []
    real_attend = pa.attend_packed
    monkeypatch.setattr(pa, "attend_packed", lambda *a, **kw: calls.append(1) or real_attend(*a, **kw))
    if not use_kwarg:
        monkeypatch.setattr("rlpost.workers.actor._takes_extra_kwargs", lambda module: False)
    mb = varied_batch(packed_model.config.vocab_size)

    def fn(logits, labels):
        return token_logp_entropy(logits, labels, 0.7, with_entropy=True)

    real = mb[keys.RESPONSE_MASK].bool()
    results = []
    for model, rmpad in ((padded_model, False), (packed_model, True)):
        both = forward_response_logits(model, mb, rmpad, fn)
        (both[..., 0][real].sum() + both[..., 1][real].sum()).backward()
        results.append((both.detach(), {n: p.grad for n, p in model.named_parameters()}))
    assert len(calls) == packed_model.config.num_hidden_layers  # every layer took the packed path
    (padded, padded_grads), (packed, packed_grads) = results
    torch.testing.assert_close(packed[real], padded[real], atol=1e-5, rtol=1e-5)
    for name, grad in padded_grads.items():
        torch.testing.assert_close(packed_grads[name], grad, atol=1e-5, rtol=1e-4, msg=name)
    # the padded path on the same (patched) model still builds SDPA's padding mask and agrees
    with torch.no_grad():
        again = forward_response_logits(packed_model, mb, False, fn)
    torch.testing.assert_close(again[real], padded[real], atol=1e-5, rtol=1e-5)


def test_generate_on_the_patched_model_equals_sdpa(tiny_model_dir):
    """HF `generate` (padding mask, KV cache, one-token decode steps) is unchanged by the packed attention."""
    from transformers import AutoModelForCausalLM

    plain = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    packed = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    pa.use_packed_attention(packed)
    ids = torch.tensor([[0, 0, 5, 6, 7], [8, 9, 10, 11, 12]])
    for rows in (2, 1):
        kw = {"input_ids": ids[:rows], "attention_mask": (ids[:rows] != 0).long(), "max_new_tokens": 5,
              "do_sample": False, "pad_token_id": 0}
        assert torch.equal(packed.generate(**kw), plain.generate(**kw))
