"""Fused LM head + log-softmax + gather (+ entropy): per-token log-probs without (tokens x vocab) logits.

The LM head normally writes (n, V) logits (bf16), then the log-prob path reads them in float32 chunks and
autograd keeps a float32 (chunk, V) log-softmax per chunk for backward. Here one autograd Function takes the
final hidden states and the head's weight: forward runs chunk by chunk (logits of `chunk` rows, their
log-sum-exp, the label's log-prob, the entropy) and keeps only the hidden states and two floats per token;
backward recomputes each chunk's logits and writes the gradients of the hidden states and the weight.

The model is still called as a whole (so FSDP gathers and frees the head's weight as usual): `fused_lm_head`
swaps the head's forward for this Function for the duration of one call, with the labels of the positions
the head will see; the model's `logits` output is then the (…, 2) [log-prob, entropy] per position.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

logger = logging.getLogger(__name__)


def eager(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The identity: per-chunk maths run eagerly."""
    return fn


@functools.lru_cache(maxsize=None)
def compiled(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`torch.compile(fn)` (dynamic shapes: chunks vary in rows), one compiled function per `fn` in the
    process. When compiling fails (no C++ compiler, an unsupported backend) it warns once and runs `fn`
    eagerly from then on: the results are the same, only slower."""
    from torch._dynamo.exc import TorchDynamoException
    from torch._inductor.exc import InductorError

    fast = torch.compile(fn, dynamic=True)
    failed: list[bool] = []

    @functools.wraps(fn)
    def run(*args: Any) -> Any:
        if not failed:
            try:
                return fast(*args)
            except (TorchDynamoException, InductorError) as exc:
                logger.warning("torch.compile of %s failed (%s); running it eagerly", fn.__name__, exc)
                failed.append(True)
        return fn(*args)

    return run


@dataclass(frozen=True)
class FusedHeadOptions:
    """How the fused head runs.

    Attributes:
        temperature: logits are divided by it. with_entropy: also compute the entropy (else it is 0).
        chunk: rows of (chunk, V) float32 logits alive at a time.
        compile_fn: wraps the per-chunk maths (`compiled` or `eager`).
    """

    temperature: float
    with_entropy: bool
    chunk: int
    compile_fn: Callable[[Callable[..., Any]], Callable[..., Any]] = eager


def chunk_stats(z: torch.Tensor, labels: torch.Tensor, with_entropy: bool
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-row log-sum-exp, label log-prob and entropy of float32 logits z (n, V); labels (n,).

    Returns:
        lse, logp, entropy: each (n,) float32 (entropy zeros unless `with_entropy`).
    """
    label_logit = z.gather(-1, labels[:, None]).squeeze(-1)
    if not with_entropy:
        lse = torch.logsumexp(z, dim=-1)
        return lse, label_logit - lse, torch.zeros_like(lse)
    # With t = z - max and e = exp(t): entropy = log(sum(e)) - sum(e * t) / sum(e). Two (n, V) temporaries (t, and
    # e reused in place for e * t) and seven passes over them; no cancellation between two large terms, as
    # lse - sum(softmax(z) * z) has when the logits sit far from zero.
    peak = z.amax(dim=-1, keepdim=True)
    t = torch.sub(z, peak)
    e = t.exp()
    total = e.sum(-1)
    log_total = total.log()
    ent = log_total - e.mul_(t).sum(-1) / total
    lse = peak.squeeze(-1) + log_total
    return lse, label_logit - lse, ent


def chunk_grad_logits(z: torch.Tensor, labels: torch.Tensor, lse: torch.Tensor, ent: torch.Tensor,
                      g_logp: torch.Tensor, g_ent: torch.Tensor | None) -> torch.Tensor:
    """Gradient wrt float32 logits z (n, V) of sum(g_logp * logp + g_ent * entropy); overwrites z.

    d logp / dz = onehot(label) - p;  d entropy / dz = -p * (log p + entropy), so the gradient is
    onehot * g_logp - p * (g_logp + (log p + entropy) * g_ent). Computed in place: two (n, V) float32 tensors
    (z and p) instead of five.
    """
    z.sub_(lse[:, None])  # log p
    p = z.exp()
    if g_ent is None:
        grad = p.mul_(-g_logp[:, None])
    else:
        grad = z.add_(ent[:, None]).mul_(g_ent[:, None]).add_(g_logp[:, None]).mul_(p).neg_()
    return grad.scatter_add_(-1, labels[:, None], g_logp[:, None])


class _FusedLogProb(torch.autograd.Function):
    """(hidden (n, d), weight (V, d), labels (n,)) -> (n, 2) float32 [log-prob, entropy]."""

    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
                opts: FusedHeadOptions) -> torch.Tensor:
        stats = opts.compile_fn(chunk_stats)
        out = hidden.new_empty((hidden.shape[0], 2), dtype=torch.float32)
        lse = hidden.new_empty((hidden.shape[0],), dtype=torch.float32)
        for i in range(0, hidden.shape[0], opts.chunk):
            # the head's matmul in the compute dtype, then float32, as the unfused head + log-prob path does
            z = (hidden[i:i + opts.chunk] @ weight.T).float() / opts.temperature
            lse[i:i + opts.chunk], out[i:i + opts.chunk, 0], out[i:i + opts.chunk, 1] = stats(
                z, labels[i:i + opts.chunk], opts.with_entropy)
        ctx.save_for_backward(hidden, weight, labels, lse, out[:, 1].clone())
        ctx.opts = opts
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None, None, None]:
        hidden, weight, labels, lse, ent = ctx.saved_tensors
        opts: FusedHeadOptions = ctx.opts
        grad_fn = opts.compile_fn(chunk_grad_logits)
        grad_h = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) \
            if ctx.needs_input_grad[1] else None
        for i in range(0, hidden.shape[0], opts.chunk):
            h = hidden[i:i + opts.chunk]
            z = (h @ weight.T).float() / opts.temperature
            g = grad_out[i:i + opts.chunk].float()
            g_ent = g[:, 1] if opts.with_entropy else None
            gz = grad_fn(z, labels[i:i + opts.chunk], lse[i:i + opts.chunk], ent[i:i + opts.chunk], g[:, 0], g_ent)
            gz = (gz / opts.temperature).to(hidden.dtype)
            if grad_h is not None:
                grad_h[i:i + opts.chunk] = gz @ weight
            if grad_w is not None:
                grad_w += (gz.T @ h).float()
        return grad_h, (grad_w.to(weight.dtype) if grad_w is not None else None), None, None


def fused_logprob(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
                  opts: FusedHeadOptions) -> torch.Tensor:
    """Log-prob of `labels` and entropy under softmax(hidden @ weight.T / temperature), chunked.

    Args:
        hidden: (n, d) final hidden states. weight: (V, d) LM head weight. labels: (n,) token ids.

    Returns:
        (n, 2) float32 [log-prob, entropy] (entropy 0 unless `opts.with_entropy`).
    """
    return _FusedLogProb.apply(hidden, weight, labels.long(), opts)


def _output_head(model: torch.nn.Module) -> torch.nn.Linear:
    """The LM head of the transformers model inside `model`; refuses heads the fused path would change."""
    from rlpost.engine.packed_attention import hf_model_of

    hf_model = hf_model_of(model)
    head = hf_model.get_output_embeddings()
    text_config = hf_model.config.get_text_config()
    if (not isinstance(head, torch.nn.Linear) or head.bias is not None
            or getattr(text_config, "final_logit_softcapping", None)):
        raise ValueError(f"use_fused_kernels: {type(hf_model).__name__} has no plain linear LM head without bias "
                         "(or it soft-caps its logits); set actor_rollout_ref.model.use_fused_kernels=false")
    return head


@contextlib.contextmanager
def fused_lm_head(model: torch.nn.Module, labels: torch.Tensor, opts: FusedHeadOptions) -> Iterator[None]:
    """Within the block, `model`'s LM head returns (…, 2) [log-prob, entropy] of `labels` instead of logits.

    Args:
        labels: (...) ids, one per position the head will be applied to (the shape of its input minus d).
    """
    head = _output_head(model)

    def forward(hidden: torch.Tensor) -> torch.Tensor:
        flat = fused_logprob(hidden.reshape(-1, hidden.shape[-1]), head.weight, labels.reshape(-1), opts)
        return flat.reshape(*hidden.shape[:-1], 2)

    head.forward = forward
    try:
        yield
    finally:
        del head.forward  # back to the class's forward
