"""Causal attention over packed rows (remove-padding) without a (N x N) mask.

A packed row holds S sequences back to back; each token attends causally within its own sequence only.
transformers would express that as a dense block-diagonal boolean mask for SDPA, which is quadratic in the
row length and keeps SDPA off its fused kernels. Here the row's sequence boundaries travel with the forward
as a keyword argument (`PackedSequences`, one per forward, so gradient checkpointing recomputes with it) and
the attention function uses what PyTorch offers on the device:

- CUDA, fp16/bf16, no dropout, `torch.nn.attention.varlen.varlen_attn` present: one varlen flash kernel
  over the whole row (cumulative sequence lengths, causal).
- otherwise (CPU, fp32, older torch, or what the flash kernel cannot express): each sequence in turn, then
  concatenated: causal SDPA (with a causal band mask for a sliding window), or, for attention-logit
  soft-capping (Gemma 2) and attention sinks (gpt-oss), the eager formula those models define.

The attention options a model passes to its attention function are honoured on every path: `sliding_window`
(per layer: Mistral, Gemma 2/3, gpt-oss), `softcap` (Gemma 2), `s_aux` (gpt-oss's per-head sink logits), and a
value head size that differs from the query/key one (MLA: DeepSeek-V3, GLM-4.5 MoE lite, Kimi).

`use_packed_attention` registers `packed_attention` with transformers' `AttentionInterface` and selects it
for a model. Its mask function builds no mask for packed calls (attention_mask=None) and SDPA's mask for
padded calls, so the same model serves both (and HF `generate`); a padded call with soft-capping or sinks
goes to the eager formula with that mask, since SDPA has neither. Ulysses sequence parallelism
(`rlpost.engine.ulysses`) runs the same `attend_packed` on its gathered rows.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F

ATTENTION_NAME = "rlpost_packed"
PACKED_KWARG = "packed_seqs"


@dataclass(frozen=True)
class PackedSequences:
    """Sequence layout of one packed row.

    Attributes:
        bounds: (S + 1,) python ints, 0 first and N last: sequence i is tokens bounds[i] .. bounds[i+1]-1.
        cu_seqlens: the same bounds as an int32 tensor on the row's device (for the varlen kernel).
        max_len: the longest sequence.
    """

    bounds: tuple[int, ...]
    cu_seqlens: torch.Tensor
    max_len: int


def packed_sequences(seq_lens: torch.Tensor | list[int], device: torch.device | str) -> PackedSequences:
    """`PackedSequences` of sequences of these lengths, in packing order (zero lengths dropped).

    Args:
        seq_lens: (S,) real tokens per sequence.
        device: where the packed row lives.
    """
    lens = [int(v) for v in (seq_lens.tolist() if isinstance(seq_lens, torch.Tensor) else seq_lens) if v > 0]
    bounds = [0]
    for n in lens:
        bounds.append(bounds[-1] + n)
    cu = torch.tensor(bounds, dtype=torch.int32, device=device)
    return PackedSequences(tuple(bounds), cu, max(lens, default=0))


@functools.lru_cache(maxsize=1)
def _varlen_kernel() -> tuple[Callable[..., torch.Tensor] | None, dict[str, Any], bool, bool]:
    """(varlen_attn or None, its causal keyword arguments, whether it takes enable_gqa, whether it takes scale).

    The signature moved between releases: torch 2.10 takes `is_causal`, later ones `window_size=(-1, 0)`;
    `enable_gqa` arrived after `window_size`.
    """
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None, {}, False, False
    params = inspect.signature(varlen_attn).parameters
    if "window_size" in params:
        causal: dict[str, Any] = {"window_size": (-1, 0)}
    elif "is_causal" in params:
        causal = {"is_causal": True}
    else:
        return None, {}, False, False
    return varlen_attn, causal, "enable_gqa" in params, "scale" in params


def varlen_available(q: torch.Tensor, dropout: float, v: torch.Tensor | None = None,
                     sliding_window: int | None = None, softcap: float | None = None,
                     sinks: torch.Tensor | None = None) -> bool:
    """True when `attend_packed` would use the varlen kernel for `q` (flash kernels: CUDA, half precision,
    one head size for q/k/v, no soft-capping or sinks, a sliding window only where the kernel takes one)."""
    kernel, causal, _, _ = _varlen_kernel()
    if kernel is None or not q.is_cuda or q.dtype not in (torch.float16, torch.bfloat16) or dropout != 0.0:
        return False
    if softcap is not None or sinks is not None or (v is not None and v.shape[-1] != q.shape[-1]):
        return False
    return sliding_window is None or "window_size" in causal


def _window_mask(n: int, window: int, device: torch.device) -> torch.Tensor:
    """(n, n) bool: query i sees keys j with i - window < j <= i (transformers' sliding-window rule)."""
    i = torch.arange(n, device=device)[:, None]
    j = torch.arange(n, device=device)[None]
    return (j <= i) & (j > i - window)


def eager_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor | None,
                    dropout: float = 0.0, scaling: float | None = None, softcap: float | None = None,
                    sinks: torch.Tensor | None = None) -> torch.Tensor:
    """Attention by its formula, for what SDPA cannot express (soft-capped logits, sink logits).

    Args:
        q: (..., H, n, D); k: (..., G, m, D), v: (..., G, m, Dv), G dividing H. allowed: bool mask broadcasting
            to (..., H, n, m), or None for causal. softcap: logits become softcap * tanh(logits / softcap).
        sinks: (H,) one extra logit per head in the softmax's denominator (its probability is dropped).

    Returns:
        (..., H, n, Dv) attention output; the softmax in float32.
    """
    rep = q.shape[-3] // k.shape[-3]
    if rep > 1:
        k, v = k.repeat_interleave(rep, dim=-3), v.repeat_interleave(rep, dim=-3)
    logits = (q @ k.transpose(-1, -2)).float() * (q.shape[-1] ** -0.5 if scaling is None else scaling)
    if softcap is not None:
        logits = torch.tanh(logits / softcap) * softcap
    if allowed is None:
        allowed = _window_mask(q.shape[-2], q.shape[-2], q.device)
    logits = logits.masked_fill(~allowed, float("-inf"))
    if sinks is not None:
        sink = sinks.float().reshape(-1, 1, 1).expand(*logits.shape[:-1], 1)
        probs = torch.softmax(torch.cat([logits, sink], dim=-1), dim=-1)[..., :-1]
    else:
        probs = torch.softmax(logits, dim=-1)
    probs = F.dropout(probs, p=dropout, training=dropout > 0).to(v.dtype)
    return probs @ v


def _attend_one(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout: float, scaling: float | None,
                sliding_window: int | None, softcap: float | None, sinks: torch.Tensor | None) -> torch.Tensor:
    """Causal attention of one sequence: q (H, n, D), k (G, n, D), v (G, n, Dv) -> (H, n, Dv)."""
    n = q.shape[1]
    band = _window_mask(n, sliding_window, q.device) if sliding_window is not None and sliding_window < n else None
    if softcap is not None or sinks is not None:
        return eager_attention(q, k, v, band, dropout, scaling, softcap, sinks)
    return F.scaled_dot_product_attention(q[None], k[None], v[None], attn_mask=band, dropout_p=dropout,
                                          is_causal=band is None, scale=scaling,
                                          enable_gqa=q.shape[0] != k.shape[0])[0]


def attend_packed(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seqs: PackedSequences,
                  dropout: float = 0.0, scaling: float | None = None, sliding_window: int | None = None,
                  softcap: float | None = None, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """Causal attention within each packed sequence.

    Args:
        q: (H, N, D) queries; k: (G, N, D), v: (G, N, Dv) with G dividing H (grouped-query attention).
        seqs: the row's sequence layout (seqs.bounds[-1] == N).
        dropout: attention dropout probability. scaling: softmax scale (None: 1 / sqrt(D)).
        sliding_window: each query sees at most this many keys, itself included (None: all before it).
        softcap: attention-logit soft-capping. sinks: (H,) sink logits (see `eager_attention`).

    Returns:
        (N, H, Dv) attention output.
    """
    if varlen_available(q, dropout, v, sliding_window, softcap, sinks):
        kernel, causal, takes_gqa, takes_scale = _varlen_kernel()
        if sliding_window is not None:
            causal = {"window_size": (sliding_window - 1, 0)}
        # Grouped-query k/v go in with their own G heads: the flash kernel maps query head h to k/v head
        # h // (H / G) itself, whether or not the wrapper has an `enable_gqa` flag (torch 2.11 has none and
        # gives the same output as with k/v repeated H / G times; forward 1.43x faster per call at 0.5B shapes,
        # benchmarks/results/2026-11-27_h200/varlen_gqa_h200.json).
        gqa = {"enable_gqa": True} if takes_gqa and q.shape[0] != k.shape[0] else {}
        scale = {"scale": scaling} if takes_scale else {}
        if scaling is not None and not takes_scale and scaling != q.shape[-1] ** -0.5:
            q = q * (scaling * q.shape[-1] ** 0.5)  # a kernel without `scale` applies 1 / sqrt(D)
        # (N, H, D), the layout the q/k/v projections wrote: contiguous without a copy
        t = (x.transpose(0, 1).contiguous() for x in (q, k, v))
        return kernel(*t, seqs.cu_seqlens, seqs.cu_seqlens, seqs.max_len, seqs.max_len, **causal, **gqa, **scale)
    outs = [_attend_one(q[:, s:e], k[:, s:e], v[:, s:e], dropout, scaling, sliding_window, softcap, sinks)
            for s, e in zip(seqs.bounds[:-1], seqs.bounds[1:])]
    return torch.cat(outs, dim=1).transpose(0, 1)


def attention_options(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Pop the options transformers' attention modules pass (`sliding_window`, `softcap`, `s_aux`) from an
    attention function's `kwargs`, as `attend_packed`'s keyword arguments."""
    return {"sliding_window": kwargs.pop("sliding_window", None), "softcap": kwargs.pop("softcap", None),
            "sinks": kwargs.pop("s_aux", None)}


def packed_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                     **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers attention function: `attend_packed` when the forward carries `packed_seqs`, else SDPA
    (the eager formula with soft-capping or sinks).

    Args:
        query: (1, H, N, D) after rotary embedding; key: (1, G, N, D), value: (1, G, N, Dv).
        attention_mask: None on packed calls; SDPA's mask on padded calls.
        kwargs: `packed_seqs` (the row's `PackedSequences`) or absent, the module's attention options
            (`attention_options`), plus transformers' own.

    Returns:
        ((1, N, H, Dv) attention output, None).
    """
    seqs: PackedSequences | None = kwargs.pop(PACKED_KWARG, None)
    if seqs is None and attention_mask is None:
        seqs = _sequences_from_positions(kwargs.get("position_ids"), query.shape[2])
    opts = attention_options(kwargs)
    if seqs is not None:
        return attend_packed(query[0], key[0], value[0], seqs, dropout, scaling, **opts)[None], None
    if opts["softcap"] is not None or opts["sinks"] is not None:
        # transformers' SDPA function drops both; its mask already holds the window
        allowed = attention_mask if attention_mask is not None and attention_mask.dtype == torch.bool else None
        if attention_mask is not None and allowed is None:
            allowed = attention_mask > torch.finfo(attention_mask.dtype).min / 2  # an additive float mask
        if allowed is None and opts["sliding_window"] is not None:
            allowed = _window_mask(query.shape[2], opts["sliding_window"], query.device)
        out = eager_attention(query, key, value, allowed, dropout, scaling, opts["softcap"], opts["sinks"])
        return out.transpose(1, 2).contiguous(), None
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                  **kwargs)


def _sequences_from_positions(position_ids: torch.Tensor | None, n: int) -> PackedSequences | None:
    """Layout of a packed row called without `packed_seqs`: a sequence starts wherever the position id is 0
    (as transformers detects packing). None when there is no position tensor or a single sequence."""
    if position_ids is None or position_ids.shape[0] != 1 or position_ids.shape[1] != n:
        return None
    starts = torch.nonzero(position_ids[0] == 0).squeeze(-1).tolist()
    if starts[:1] != [0] or len(starts) == 1:
        return None
    return packed_sequences([e - s for s, e in zip(starts, [*starts[1:], n])], position_ids.device)


def mask_unless_packed(*args: Any, attention_mask: torch.Tensor | None = None, **kwargs: Any
                       ) -> torch.Tensor | None:
    """transformers mask function: no mask for a packed row (`attention_mask` None: the sequence bounds
    define it), SDPA's mask for a padded batch."""
    from transformers.masking_utils import sdpa_mask

    if attention_mask is None:
        return None
    return sdpa_mask(*args, attention_mask=attention_mask, **kwargs)


def hf_model_of(model: torch.nn.Module) -> Any:
    """The transformers `PreTrainedModel` inside `model` (FSDP, PEFT or other wrappers)."""
    from transformers import PreTrainedModel

    return next(m for m in model.modules() if isinstance(m, PreTrainedModel))


def select_attention(model: torch.nn.Module, name: str, fn: Callable[..., Any]) -> None:
    """Register `fn` under `name` (with `mask_unless_packed`) and make `model` dispatch its attention to it.

    Raises:
        ValueError: the model does not dispatch attention through transformers' `AttentionInterface`.
    """
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    hf_model = hf_model_of(model)
    AttentionInterface.register(name, fn)
    ALL_MASK_ATTENTION_FUNCTIONS.register(name, mask_unless_packed)
    tower = getattr(getattr(hf_model, "model", None), "visual", None)
    tower_attn = None if tower is None else tower.config._attn_implementation
    hf_model.set_attn_implementation(name)
    if tower is not None:
        # a vision tower attends over whole images (not causal, its own bounds): it keeps its attention and never
        # sees the text's packed layout
        tower.set_attn_implementation(tower_attn)
    if hf_model.config._attn_implementation != name:
        raise ValueError(f"{type(hf_model).__name__} does not dispatch attention through transformers' "
                         "AttentionInterface; packed attention cannot patch it")


def use_packed_attention(model: torch.nn.Module) -> None:
    """Route `model`'s attention through `packed_attention` (full, sliding-window, soft-capped, sink and MLA
    attention alike) and its linear-attention layers through per-sequence state
    (`rlpost.engine.linear_attention`)."""
    from rlpost.engine.linear_attention import use_per_sequence_state

    select_attention(model, ATTENTION_NAME, packed_attention)
    use_per_sequence_state(model)
