"""On one GPU, bf16: packed attention (varlen_attn when the installed torch has it) gives the padded path's
log-probs, entropy and gradients; the fused LM head gives the unfused head's (0.5B-shaped heads, 2 layers)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from rlpost import keys
from rlpost.engine import packed_attention as pa
from rlpost.engine.fused_logprob import FusedHeadOptions
from rlpost.workers.actor import forward_response_logits, token_logp_entropy

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "utils"))
from _batches import varied_batch  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(300)]


def _model():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(hidden_size=896, num_hidden_layers=2, num_attention_heads=14, num_key_value_heads=2,
                      intermediate_size=1024, vocab_size=4096, tie_word_embeddings=True)
    torch.manual_seed(0)
    return Qwen2ForCausalLM(cfg).to("cuda", torch.bfloat16)


def _run(model, mb, rmpad, fused=None):
    def fn(logits, labels):
        return token_logp_entropy(logits, labels, 1.0, with_entropy=True)

    model.zero_grad()
    both = forward_response_logits(model, mb, rmpad, fn, fused=fused)
    real = mb[keys.RESPONSE_MASK].bool()
    (both[..., 0][real].sum() + both[..., 1][real].sum()).backward()
    return both.detach().float(), {n: p.grad.float().clone() for n, p in model.named_parameters()}


def _close_grads(a, b):
    for name in a:
        rel = (a[name] - b[name]).norm() / b[name].norm().clamp(min=1e-6)
        assert rel < 3e-2, (name, rel.item())


def test_packed_equals_padded_in_bf16():
    model = _model()
    pa.use_packed_attention(model)
    assert model.config._attn_implementation == pa.ATTENTION_NAME
    mb = {k: v.cuda() for k, v in varied_batch(4096, p=64, r=192).items()}
    real = mb[keys.RESPONSE_MASK].bool()
    padded, padded_grads = _run(model, mb, False)
    packed, packed_grads = _run(model, mb, True)
    print("varlen kernel used:", pa.varlen_available(torch.zeros(1, device="cuda", dtype=torch.bfloat16), 0.0))
    torch.testing.assert_close(packed[real], padded[real], atol=5e-2, rtol=2e-2)
    _close_grads(packed_grads, padded_grads)


def test_fused_equals_unfused_in_bf16():
    model = _model()
    mb = {k: v.cuda() for k, v in varied_batch(4096, p=64, r=192).items()}
    real = mb[keys.RESPONSE_MASK].bool()
    plain, plain_grads = _run(model, mb, False)
    fused, fused_grads = _run(model, mb, False, FusedHeadOptions(1.0, True, chunk=100))
    torch.testing.assert_close(fused[real], plain[real], atol=2e-3, rtol=2e-3)
    _close_grads(fused_grads, plain_grads)


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_triton_logprob_equals_torch_maths(temperature):
    """The Triton log-prob/entropy kernels (taken on CUDA) against the float32 PyTorch chunks, on bf16 logits of
    Qwen2.5's vocabulary: values, and the logits' gradient through both outputs."""
    torch.manual_seed(0)
    logits = (torch.randn(3000, 151936, device="cuda") * 4).to(torch.bfloat16).requires_grad_()
    labels = torch.randint(0, 151936, (3000,), device="cuda")
    weights = torch.randn(3000, 2, device="cuda")
    results = []
    for kernel in ("auto", "torch"):
        out = token_logp_entropy(logits, labels, temperature, with_entropy=True, kernel=kernel)
        (out * weights).sum().backward()
        results.append((out.detach(), logits.grad.float()))
        logits.grad = None
    (tri, tri_grad), (ref, ref_grad) = results
    torch.testing.assert_close(tri, ref, atol=2e-4, rtol=1e-5)
    assert ((tri_grad - ref_grad).norm() / ref_grad.norm()).item() < 1e-2


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_triton_logprob_with_minus_inf_logits_against_float64(temperature):
    """Logits with -inf entries (every row, and one row whose whole first block is -inf): finite log-probs and
    entropies equal to float64 PyTorch, a zero gradient at the -inf entries. Labels sit on finite logits. The same
    checks ran on an H200 as a script (2026-11-27: values within 4e-6, gradient relative error 1.7e-3)."""
    from rlpost.engine import triton_logprob

    torch.manual_seed(0)
    n, vocab = 1024, 151936
    x = torch.randn(n, vocab, device="cuda") * 4
    x[:, 5:9000:7] = float("-inf")
    x[3, :4096] = float("-inf")
    labels = torch.randint(0, vocab, (n,), device="cuda")
    labels[torch.isinf(x.gather(1, labels[:, None]).squeeze(1))] = vocab - 1  # finite in every row
    logits = x.to(torch.bfloat16).requires_grad_()
    out = triton_logprob.logp_entropy(logits, labels, temperature, with_entropy=True)
    weights = torch.randn(n, 2, device="cuda")
    (out * weights).sum().backward()
    ref_in = logits.detach().double().clamp_min(-1e4).requires_grad_()  # exp(-1e4) is 0 in float64: finite grads
    log_p = torch.log_softmax(ref_in / temperature, -1)
    p = log_p.exp()
    ref = torch.stack([log_p.gather(-1, labels[:, None]).squeeze(-1), -(p * log_p).sum(-1)], -1)
    (ref * weights.double()).sum().backward()
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.double(), ref, atol=2e-5, rtol=1e-5)
    assert (logits.grad[torch.isinf(x)] == 0).all()
    grad = logits.grad.double()
    assert ((grad - ref_in.grad).norm() / ref_in.grad.norm()).item() < 1e-2


def test_packed_attention_takes_grouped_kv_heads_as_they_are():
    """`attend_packed` with 2-head k/v (straight into varlen_attn) equals the same call with k/v repeated to 14
    heads: outputs and k/v gradients exactly, q gradients to one bf16 ulp. Guards a torch upgrade whose varlen
    wrapper would stop mapping query heads to k/v heads itself."""
    if not pa.varlen_available(torch.zeros(1, device="cuda", dtype=torch.bfloat16), 0.0):
        pytest.skip("this torch has no varlen_attn")
    torch.manual_seed(0)
    seqs = pa.packed_sequences([540] * 6 + [97], "cuda")
    n = seqs.bounds[-1]
    q, k, v = (torch.randn(h, n, 64, device="cuda", dtype=torch.bfloat16).requires_grad_() for h in (14, 2, 2))
    grad_out = torch.randn(n, 14, 64, device="cuda", dtype=torch.bfloat16)
    results = []
    for repeat in (False, True):
        kk, vv = (k.repeat_interleave(7, 0), v.repeat_interleave(7, 0)) if repeat else (k, v)
        out = pa.attend_packed(q, kk, vv, seqs)
        out.backward(grad_out)
        results.append([out.detach(), q.grad, k.grad, v.grad])
        q.grad = k.grad = v.grad = None
    (out, dq, dk, dv), (ref, ref_dq, ref_dk, ref_dv) = results
    assert torch.equal(out, ref) and torch.equal(dk, ref_dk) and torch.equal(dv, ref_dv)
    torch.testing.assert_close(dq, ref_dq, atol=2e-3, rtol=1e-2)
