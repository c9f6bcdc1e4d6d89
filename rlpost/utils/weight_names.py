"""Trainer tensors under the names and layout of the model's checkpoint, the form every engine loads.

transformers (5.x) keeps some weights in memory in another layout than on disk: the routed experts of MoE
models as one fused (experts, 2 x intermediate, hidden) `experts.gate_up_proj` and one `experts.down_proj`,
where the checkpoint has `experts.{e}.gate_proj/up_proj/down_proj.weight` per expert. An engine's weight loader
reads the checkpoint layout (vLLM's DeepSeek-V3, GLM-4.5 and gpt-oss loaders fail or skip on the fused names),
so the in-place sync sends what `save_pretrained` would write: transformers' own reverse conversion, applied
one tensor at a time as the stream passes, and no second copy of a tied weight (an LM head tied to the input
embedding is not in the checkpoint, and vLLM's Gemma loaders refuse a name they have no parameter for).
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator

import torch


def _reverter(hf_model: Any) -> Any:
    """A function {name: tensor} -> {checkpoint name: tensor} for `hf_model`, or None when nothing is converted."""
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import revert_weight_conversion
    except ImportError:  # transformers 4.x: the in-memory layout is the checkpoint's
        return None
    if getattr(hf_model, "_weight_conversions", None) is None and not get_model_conversion_mapping(
            hf_model, add_legacy=False):
        return None
    return lambda named: revert_weight_conversion(hf_model, named)


def checkpoint_names(model: torch.nn.Module, named: Iterable[tuple[str, torch.Tensor]]
                     ) -> Iterator[tuple[str, torch.Tensor]]:
    """(checkpoint name, tensor) pairs of `named`, which holds `model`'s state-dict entries (full tensors) in
    any order; entries stored as on disk pass through unchanged, tied copies are dropped. Lazy: one entry
    converted at a time."""
    from rlpost.engine.packed_attention import hf_model_of

    try:
        hf_model = hf_model_of(model)
    except StopIteration:  # not a transformers model: its names are its own
        yield from named
        return
    tied = set(getattr(hf_model, "all_tied_weights_keys", None) or {})
    revert = _reverter(hf_model)
    for name, tensor in named:
        if name in tied:
            continue
        if revert is None:
            yield name, tensor
        else:
            yield from revert({name: tensor}).items()
