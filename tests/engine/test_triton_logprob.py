"""`rlpost.engine.triton_logprob` (the GPU's log-prob/entropy kernels) run on the CPU by Triton's interpreter,
against float64 PyTorch: values and gradients, with and without entropy and temperature, bf16 and float32
logits, logits far from zero, a vocabulary that is not a multiple of the kernel's block, no rows."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.timeout(180)

pytest.importorskip("triton")

SCRIPT = textwrap.dedent('''
    import torch
    from rlpost.engine import triton_logprob as tlp

    assert tlp.available()
    torch.manual_seed(0)
    worst = {}
    for dtype, tol_val, tol_grad in ((torch.float32, 1e-4, 1e-4), (torch.bfloat16, 1e-4, 2e-2)):
        for vocab in (300, 4096 + 37):
            offsets = torch.tensor([0.0, 500.0, -200.0, 0.0, 10.0])[:, None]
            base = torch.randn(5, vocab + 13) * 3 + offsets
            logits = base.to(dtype)[:, :vocab].detach().requires_grad_()  # rows not contiguous with each other
            labels = torch.randint(0, vocab, (5,))
            for temperature in (1.0, 0.7):
                for with_entropy in (True, False):
                    out = tlp.logp_entropy(logits, labels, temperature, with_entropy)
                    assert out.shape == (5, 2 if with_entropy else 1) and out.dtype == torch.float32
                    ref_in = logits.detach().double().requires_grad_()
                    logp_all = torch.log_softmax(ref_in / temperature, -1)
                    ref = [logp_all.gather(-1, labels[:, None]).squeeze(-1)]
                    if with_entropy:
                        ref.append(-(logp_all.exp() * logp_all).sum(-1))
                    ref = torch.stack(ref, -1)
                    assert (out.double() - ref).abs().max() < tol_val, (dtype, vocab, temperature, with_entropy)
                    weights = torch.randn(out.shape, dtype=torch.float64)
                    (out.double() * weights).sum().backward()
                    (ref * weights).sum().backward()
                    assert logits.grad.dtype == dtype
                    err = (logits.grad.double() - ref_in.grad).abs().max().item()
                    assert err < tol_grad * max(1.0, ref_in.grad.abs().max().item()), (dtype, vocab, err)
                    logits.grad = None
    # -inf logits (masked vocabulary entries), a whole first block of them included: finite values and
    # gradients, zero gradient on the masked entries
    masked = torch.randn(3, 4096 + 300) * 2
    masked[:, 7:4200:3] = float("-inf")
    masked[1, :4096] = float("-inf")
    labels = torch.tensor([0, 4100, 5])
    masked.requires_grad_()
    got = tlp.logp_entropy(masked, labels, 1.0, True)
    ref_in = masked.detach().double()
    logp_all = torch.log_softmax(ref_in, -1)
    p = logp_all.exp()
    want_ent = -torch.where(p > 0, p * logp_all, torch.zeros_like(p)).sum(-1)
    assert torch.isfinite(got).all()
    assert (got[:, 0].double() - logp_all.gather(-1, labels[:, None]).squeeze(-1)).abs().max() < 1e-4
    assert (got[:, 1].double() - want_ent).abs().max() < 1e-4
    got.sum().backward()
    assert torch.isfinite(masked.grad).all() and (masked.grad[torch.isinf(masked.detach())] == 0).all()
    empty = torch.zeros(0, 300, requires_grad=True)
    out = tlp.logp_entropy(empty, torch.zeros(0, dtype=torch.long), 1.0, True)
    out.sum().backward()
    assert out.shape == (0, 2) and empty.grad.shape == (0, 300)
    print("ok")
''')


def test_kernels_match_float64_torch_under_the_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=170)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stdout[-2000:] + done.stderr[-4000:]


@pytest.mark.parametrize("with_entropy", [True, False])
def test_kernels_compile_for_hopper_without_a_gpu(with_entropy):
    """Both kernels go through Triton's whole compiler for sm90 (H100/H200), cubin included, on this machine."""
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from rlpost.engine import triton_logprob as tlp

    fwd, bwd = tlp._kernels()
    row = {"z_ptr": "*bf16", "stride": "i64"}
    fwd_sig = {**row, "labels_ptr": "*i64", "logp_ptr": "*fp32", "ent_ptr": "*fp32", "lse_ptr": "*fp32",
               "vocab": "i32", "inv_temp": "fp32", "WITH_ENTROPY": "constexpr", "BLOCK": "constexpr"}
    bwd_sig = {**row, "grad_ptr": "*bf16", "grad_stride": "i64", "labels_ptr": "*i64", "lse_ptr": "*fp32",
               "ent_ptr": "*fp32", "g_logp_ptr": "*fp32", "g_ent_ptr": "*fp32", "vocab": "i32", "inv_temp": "fp32",
               "WITH_ENTROPY": "constexpr", "BLOCK": "constexpr"}
    consts = {"WITH_ENTROPY": with_entropy, "BLOCK": tlp._BLOCK}
    for kernel, sig in ((fwd, fwd_sig), (bwd, bwd_sig)):
        try:
            compiled = triton.compile(ASTSource(fn=kernel, signature=sig, constexprs=consts),
                                      target=GPUTarget("cuda", 90, 32))
        except RuntimeError as exc:  # no ptxas in this Triton build: nothing to check here
            if "ptxas" in str(exc).lower():
                pytest.skip(f"Triton cannot assemble for sm90 here: {exc}")
            raise
        assert compiled.asm["cubin"], kernel


def test_the_estimate_and_the_workers_decide_alike_without_a_gpu():
    """The start-up memory estimate asks `expected(device)` (no CUDA started); a worker asks `supports(logits)`.
    Without a GPU: a CPU run takes the PyTorch chunks in both; a CUDA run is expected to take the kernels
    when Triton is installed (it is, here)."""
    import torch

    from rlpost.engine import triton_logprob as tlp

    assert not tlp.expected("cpu") and not tlp.supports(torch.zeros(2, 3))
    assert tlp.expected("cuda")
