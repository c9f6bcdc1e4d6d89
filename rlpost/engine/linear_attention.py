"""Per-sequence state for the linear-attention (recurrent) layers of hybrid models on packed rows.

Hybrid models (Qwen3-Next, Qwen3.5: Gated DeltaNet layers between full-attention layers) carry a recurrent
state and a short causal convolution along the sequence. On a packed row those would run straight across the
boundary from one sequence into the next: every sequence after the first would start from the previous one's
state. The attention layers are told the boundaries (`rlpost.engine.packed_attention`); these layers are
given them here: each recurrent mixer runs once per packed sequence, from a zero state, and the outputs are
concatenated. That is exactly each sequence run alone (the reference kernels of transformers take no
sequence boundaries; a varlen kernel would only be faster, not different).

The boundaries arrive as the forward's `packed_seqs` keyword argument (transformers hands a decoder layer's
keyword arguments to its token mixer), so gradient checkpointing recomputes with the same layout.
"""

from __future__ import annotations

import types
from typing import Any

import torch

from rlpost.engine.packed_attention import PACKED_KWARG

# Attribute names of the recurrent token mixers in transformers' hybrid decoder layers.
MIXER_ATTRIBUTES = ("linear_attn",)
_WRAPPED = "_rlpost_per_sequence"


def recurrent_mixers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The recurrent token mixers of `model`'s decoder layers (empty for attention-only models)."""
    found = []
    for module in model.modules():
        for name in MIXER_ATTRIBUTES:
            mixer = getattr(module, name, None)
            if isinstance(mixer, torch.nn.Module):
                found.append(mixer)
    return found


def _per_sequence_forward(mixer: torch.nn.Module, hidden_states: torch.Tensor, *args: Any, **kwargs: Any
                          ) -> torch.Tensor:
    """The mixer's own forward on each packed sequence of `hidden_states` (1, N, D) in turn."""
    seqs = kwargs.pop(PACKED_KWARG, None)
    original = type(mixer).forward
    if seqs is None or len(seqs.bounds) <= 2:
        return original(mixer, hidden_states, *args, **kwargs)
    if hidden_states.shape[0] != 1 or kwargs.get("cache_params") is not None:
        raise ValueError("a packed row is one batch row without a cache; got "
                         f"batch {hidden_states.shape[0]}, cache {kwargs.get('cache_params') is not None}")
    outs = [original(mixer, hidden_states[:, s:e], *args, **kwargs)
            for s, e in zip(seqs.bounds[:-1], seqs.bounds[1:])]
    return torch.cat(outs, dim=1)


def use_per_sequence_state(model: torch.nn.Module) -> int:
    """Make every recurrent mixer of `model` restart its state at each packed sequence (idempotent).

    Returns:
        the number of mixers patched (0 for attention-only models).
    """
    mixers = recurrent_mixers(model)
    for mixer in mixers:
        if not getattr(mixer, _WRAPPED, False):
            mixer.forward = types.MethodType(_per_sequence_forward, mixer)
            setattr(mixer, _WRAPPED, True)
    return len(mixers)
