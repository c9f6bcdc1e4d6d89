"""Log-prob and entropy of (tokens x vocab) logits in one Triton pass per row, forward and backward.

The PyTorch path (`rlpost.workers.actor.token_logp_entropy`) turns bf16 logits into float32 chunks and runs
log-softmax (or max, subtract, exp and two sums for the entropy) over them: several passes over a float32 copy,
and autograd keeps a float32 (chunk, V) tensor per chunk. Here each Triton program reads one row of the logits
in its own dtype once, keeping a running maximum m, s = sum(exp(z - m)) and w = sum(exp(z - m) * (z - m)), both
rescaled when m grows (online softmax). Then log-sum-exp = m + log s, the label's log-prob = z[label] - lse and
the entropy = log s - w / s (no cancellation between two large terms when the logits sit far from zero).
Backward reads the row once more and writes the logits' gradient in their dtype:

    d logp / dz = onehot(label) - p,    d entropy / dz = -p * (log p + entropy).

Autograd saves only the logits (already in memory) and two floats per token. Used on CUDA tensors when Triton
imports (`available`); the kernels also run under `TRITON_INTERPRET=1` on the CPU, which is how the CPU tests
check them.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any

import torch

_BLOCK = 4096  # vocabulary entries per step of a program's loop


@functools.lru_cache(maxsize=1)
def _kernels() -> tuple[Any, Any] | None:
    """(forward kernel, backward kernel), or None when Triton does not import."""
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return None

    @triton.jit
    def forward_kernel(z_ptr, stride, labels_ptr, logp_ptr, ent_ptr, lse_ptr, vocab, inv_temp,
                       WITH_ENTROPY: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        base = z_ptr + row * stride
        m = tl.full((), float("-inf"), tl.float32)
        s = tl.zeros((), tl.float32)
        w = tl.zeros((), tl.float32)
        for start in range(0, vocab, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            inside = cols < vocab
            z = tl.load(base + cols, mask=inside, other=float("-inf")).to(tl.float32) * inv_temp
            m_new = tl.maximum(m, tl.max(z, axis=0))
            m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)  # a block of -inf logits so far: stay finite
            scale = tl.exp(m - m_ref)
            t = z - m_ref
            e = tl.exp(t)  # 0 for -inf logits and masked lanes
            if WITH_ENTROPY:  # sum e (z - m) under the old m, moved to the new one: scale * (w - (m_new - m) * s)
                shift = tl.where(m == float("-inf"), 0.0, m_ref - m)
                w = scale * (w - shift * s) + tl.sum(tl.where(e > 0, e * t, 0.0), axis=0)
            s = s * scale + tl.sum(e, axis=0)
            m = m_new
        log_s = tl.log(s)
        lse = m + log_s
        label = tl.load(labels_ptr + row).to(tl.int64)
        z_label = tl.load(base + label).to(tl.float32) * inv_temp
        tl.store(logp_ptr + row, z_label - lse)
        tl.store(lse_ptr + row, lse)
        if WITH_ENTROPY:
            tl.store(ent_ptr + row, log_s - w / s)

    @triton.jit
    def backward_kernel(z_ptr, stride, grad_ptr, grad_stride, labels_ptr, lse_ptr, ent_ptr, g_logp_ptr, g_ent_ptr,
                        vocab, inv_temp, WITH_ENTROPY: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        base = z_ptr + row * stride
        out = grad_ptr + row * grad_stride
        lse = tl.load(lse_ptr + row)
        g_logp = tl.load(g_logp_ptr + row)
        label = tl.load(labels_ptr + row).to(tl.int64)
        if WITH_ENTROPY:
            ent = tl.load(ent_ptr + row)
            g_ent = tl.load(g_ent_ptr + row)
        for start in range(0, vocab, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            inside = cols < vocab
            log_p = tl.where(inside, tl.load(base + cols, mask=inside, other=0.0).to(tl.float32) * inv_temp - lse, 0.0)
            p = tl.exp(log_p)
            g = -p * g_logp
            if WITH_ENTROPY:  # p log p -> 0 where p == 0 (a -inf logit)
                g -= tl.where(p > 0, p * (log_p + ent), 0.0) * g_ent
            g = tl.where(cols == label, g + g_logp, g) * inv_temp  # through z = logits / temperature
            tl.store(out + cols, g.to(grad_ptr.dtype.element_ty), mask=inside)

    return forward_kernel, backward_kernel


def available() -> bool:
    """True when the Triton kernels can be built (Triton imports)."""
    return _kernels() is not None


@functools.lru_cache(maxsize=None)
def _capable(device_index: int) -> bool:
    """Compute capability 8.0 or newer (bf16 loads); asked once per GPU."""
    return torch.cuda.get_device_capability(device_index) >= (8, 0)


def supports(logits: torch.Tensor) -> bool:
    """True when `logp_entropy` runs these kernels for `logits`: a CUDA tensor on a GPU of compute capability
    8.0 or newer, with Triton importable. Labels must lie in [0, V): they are not checked."""
    if not logits.is_cuda:
        return False
    index = logits.device.index if logits.device.index is not None else torch.cuda.current_device()
    return _capable(index) and available()


def expected(device_type: str) -> bool:
    """Whether workers on `device_type` will take these kernels, asked from a process that must not start CUDA
    (the driver's start-up memory estimate): a CUDA run with Triton installed, found without importing it. The
    workers also need compute capability 8.0 (`supports`); GPUs below it have no bf16 and run fp16/fp32 models."""
    import importlib.util

    return device_type == "cuda" and importlib.util.find_spec("triton") is not None


def _forward(logits: torch.Tensor, labels: torch.Tensor, inv_temp: float, with_entropy: bool
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    fwd, _ = _kernels()  # type: ignore[misc]
    n, vocab = logits.shape
    logp, lse = (logits.new_empty(n, dtype=torch.float32) for _ in range(2))
    ent = logits.new_zeros(n, dtype=torch.float32)
    if n:
        with torch.cuda.device(logits.device) if logits.is_cuda else contextlib.nullcontext():
            fwd[(n,)](logits, logits.stride(0), labels, logp, ent, lse, vocab, inv_temp,
                      WITH_ENTROPY=with_entropy, BLOCK=_BLOCK)
    return logp, ent, lse


class _LogProbEntropy(torch.autograd.Function):
    """(logits (n, V), labels (n,)) -> (log-probs (n,), entropies (n,)) of softmax(logits * inv_temp)."""

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, labels: torch.Tensor, inv_temp: float, with_entropy: bool
                ) -> tuple[torch.Tensor, torch.Tensor]:
        logp, ent, lse = _forward(logits, labels, inv_temp, with_entropy)
        ctx.save_for_backward(logits, labels, lse, ent)
        ctx.inv_temp, ctx.with_entropy = inv_temp, with_entropy
        return logp, ent

    @staticmethod
    def backward(ctx: Any, g_logp: torch.Tensor, g_ent: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        _, bwd = _kernels()  # type: ignore[misc]
        logits, labels, lse, ent = ctx.saved_tensors
        grad = torch.empty_like(logits)
        n, vocab = logits.shape
        if n:
            with torch.cuda.device(logits.device) if logits.is_cuda else contextlib.nullcontext():
                bwd[(n,)](logits, logits.stride(0), grad, grad.stride(0), labels, lse, ent,
                          g_logp.float().contiguous(), g_ent.float().contiguous(), vocab, ctx.inv_temp,
                          WITH_ENTROPY=ctx.with_entropy, BLOCK=_BLOCK)
        return grad, None, None, None


def logp_entropy(logits: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0, with_entropy: bool = False
                 ) -> torch.Tensor:
    """Log-prob of `labels` (and entropy) under softmax(logits / temperature), differentiable.

    Args:
        logits: (n, V) in any float dtype (read as it is; the maths run in float32). labels: (n,) token ids.

    Returns:
        (n, 1) log-probs, or (n, 2) [log-prob, entropy] when `with_entropy`; float32.
    """
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    logp, ent = _LogProbEntropy.apply(logits, labels.contiguous(), 1.0 / float(temperature), bool(with_entropy))
    return torch.stack([logp, ent], dim=-1) if with_entropy else logp[:, None]
