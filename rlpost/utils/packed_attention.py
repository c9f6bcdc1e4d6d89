"""Causal attention over packed rows (remove-padding) without a (N x N) mask.

A packed row holds S sequences back to back; each token attends causally within its own sequence only.
transformers would express that as a dense block-diagonal boolean mask for SDPA, which is quadratic in the
row length and keeps SDPA off its fused kernels. Here the row's sequence boundaries travel with the forward
as a keyword argument (`PackedSequences`, one per forward, so gradient checkpointing recomputes with it) and
the attention function uses what PyTorch offers on the device:

- CUDA, fp16/bf16, no dropout, `torch.nn.attention.varlen.varlen_attn` present: one varlen flash kernel
  over the whole row (cumulative sequence lengths, causal).
- otherwise (CPU, fp32, older torch): causal SDPA on each sequence in turn, then concatenated.

`use_packed_attention` registers `packed_attention` with transformers' `AttentionInterface` and selects it
for a model. Its mask function builds no mask for packed calls (attention_mask=None) and SDPA's mask for
padded calls, so the same model serves both (and HF `generate`). Ulysses sequence parallelism
(`rlpost.utils.ulysses`) runs the same `attend_packed` on its gathered rows.
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


def varlen_available(q: torch.Tensor, dropout: float) -> bool:
    """True when `attend_packed` would use the varlen kernel for `q` (flash kernels: CUDA, half precision)."""
    return (_varlen_kernel()[0] is not None and q.is_cuda and q.dtype in (torch.float16, torch.bfloat16)
            and dropout == 0.0)


def attend_packed(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seqs: PackedSequences,
                  dropout: float = 0.0, scaling: float | None = None) -> torch.Tensor:
    """Causal attention within each packed sequence.

    Args:
        q: (H, N, D) queries; k, v: (G, N, D) with G dividing H (grouped-query attention).
        seqs: the row's sequence layout (seqs.bounds[-1] == N).
        dropout: attention dropout probability. scaling: softmax scale (None: 1 / sqrt(D)).

    Returns:
        (N, H, D) attention output.
    """
    if varlen_available(q, dropout):
        kernel, causal, takes_gqa, takes_scale = _varlen_kernel()
        # Grouped-query k/v go in with their own G heads: the flash kernel maps query head h to k/v head
        # h // (H / G) itself, whether or not the wrapper has an `enable_gqa` flag (torch 2.11 has none and
        # gives the same output as with k/v repeated H / G times; forward 1.43x faster per call at 0.5B shapes,
        # benchmarks/results/varlen_gqa_h200.json).
        gqa = {"enable_gqa": True} if takes_gqa and q.shape[0] != k.shape[0] else {}
        scale = {"scale": scaling} if takes_scale else {}
        if scaling is not None and not takes_scale and scaling != q.shape[-1] ** -0.5:
            q = q * (scaling * q.shape[-1] ** 0.5)  # a kernel without `scale` applies 1 / sqrt(D)
        # (N, H, D), the layout the q/k/v projections wrote: contiguous without a copy
        t = (x.transpose(0, 1).contiguous() for x in (q, k, v))
        return kernel(*t, seqs.cu_seqlens, seqs.cu_seqlens, seqs.max_len, seqs.max_len, **causal, **gqa, **scale)
    gqa = q.shape[0] != k.shape[0]
    outs = [F.scaled_dot_product_attention(q[None, :, s:e], k[None, :, s:e], v[None, :, s:e], dropout_p=dropout,
                                           is_causal=True, scale=scaling, enable_gqa=gqa)[0]
            for s, e in zip(seqs.bounds[:-1], seqs.bounds[1:])]
    return torch.cat(outs, dim=1).transpose(0, 1)


def packed_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                     **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers attention function: `attend_packed` when the forward carries `packed_seqs`, else SDPA.

    Args:
        query: (1, H, N, D) after rotary embedding; key, value: (1, G, N, D).
        attention_mask: None on packed calls; SDPA's mask on padded calls.
        kwargs: `packed_seqs` (the row's `PackedSequences`) or absent, plus transformers' own.

    Returns:
        ((1, N, H, D) attention output, None).
    """
    seqs: PackedSequences | None = kwargs.pop(PACKED_KWARG, None)
    if seqs is None and attention_mask is None:
        seqs = _sequences_from_positions(kwargs.get("position_ids"), query.shape[2])
    if seqs is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, **kwargs)
    return attend_packed(query[0], key[0], value[0], seqs, dropout, scaling)[None], None


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


def has_sliding_window(model: torch.nn.Module) -> bool:
    """True for models whose config turns on sliding-window attention (not expressed by the packed paths)."""
    text_config = hf_model_of(model).config.get_text_config()
    return bool(getattr(text_config, "use_sliding_window", False) and getattr(text_config, "sliding_window", None))


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
    hf_model.set_attn_implementation(name)
    if hf_model.config._attn_implementation != name:
        raise ValueError(f"{type(hf_model).__name__} does not dispatch attention through transformers' "
                         "AttentionInterface; packed attention cannot patch it")


def use_packed_attention(model: torch.nn.Module) -> bool:
    """Route `model`'s attention through `packed_attention`. Sliding-window models keep SDPA with
    transformers' block mask (correct, slower). Returns True when the packed path was selected."""
    if has_sliding_window(model):
        return False
    select_attention(model, ATTENTION_NAME, packed_attention)
    return True
