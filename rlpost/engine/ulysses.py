"""Ulysses sequence parallelism (SP): the ranks of one SP group share the same rows, each runs a slice of the
packed sequence, and attention swaps sequence slices for head slices with an all-to-all.

Layout. FSDP shards the parameters over all ranks as before; the SP groups are blocks of `size` consecutive
ranks, so the data-parallel size is world / size. Inside a group every rank holds the same micro-batch,
packed into one row of N real tokens (remove-padding), padded to a multiple of `size` and cut into `size`
equal slices of L = N / size tokens: rank r embeds, projects and runs the MLPs of tokens [r*L, (r+1)*L).

Attention. Rotary embeddings are applied per token before attention (each rank knows its tokens' position
ids), then an all-to-all turns (H heads, L tokens) into (H / size heads, N tokens): every rank attends over
the whole row for its heads, causally within each packed sequence (`rlpost.engine.packed_attention`: no token
attends across sequences), and a second all-to-all turns the result back. When the model has fewer KV heads than
`size` (GQA) the KV heads are repeated first so that each rank gets whole KV heads for its query heads.

The attention is patched from outside the model: `use_ulysses_attention` registers `ulysses_attention` with
transformers' `AttentionInterface` and selects it for the model; the per-forward layout (`PackedShard`)
reaches the attention layers as a forward keyword argument, so gradient checkpointing recomputes with it.
Called without one (e.g. HF `generate` on the actor's module), it is `packed_attention` (SDPA for padded
batches).

Gradients. Each rank of a group computes the same loss from the gathered per-token outputs
(`gather_sequence`) and back-propagates its own slice, so the group's parameter gradients sum to the full
gradient; FSDP averages over all world ranks, i.e. over `size` copies of each group, hence the gather's
backward multiplies by `size`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from rlpost.engine.packed_attention import (PackedSequences, attend_packed, attention_options, hf_model_of,
                                           packed_attention, packed_sequences, select_attention)

ATTENTION_NAME = "rlpost_ulysses"
SHARD_KWARG = "ulysses_shard"


@dataclass(frozen=True)
class SequenceParallel:
    """This rank's Ulysses group: `size` consecutive ranks, this rank at index `rank`."""

    group: Any
    size: int
    rank: int


def sp_size(sp: SequenceParallel | None) -> int:
    """Ranks per group; 1 without sequence parallelism."""
    return 1 if sp is None else sp.size


def new_sequence_parallel(size: int) -> SequenceParallel | None:
    """Split all ranks into SP groups of `size` consecutive ranks (collective: every rank calls it with the
    same size). None when `size` is 1 (no SP)."""
    from rlpost.utils.distributed import consecutive_groups

    if size == 1:
        return None
    group, rank = consecutive_groups(size, backend=None)  # the default backends: gloo on CPU, nccl on CUDA
    return SequenceParallel(group, size, rank)


def sync_rng(sp: SequenceParallel) -> None:
    """Give every rank of the group the CPU generator state of its first rank (a shuffle without a seed must
    draw the same permutation on all ranks that share the rows)."""
    state = [torch.get_rng_state()]
    dist.broadcast_object_list(state, src=dist.get_global_rank(sp.group, 0), group=sp.group)
    torch.set_rng_state(state[0])


class _AllToAll(torch.autograd.Function):
    """Chunk i of dim 0 goes to rank i; chunk i of the result came from rank i. Its own transpose."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        return _all_to_all(x, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return _all_to_all(grad, ctx.group), None


def _all_to_all(x: torch.Tensor, group: Any) -> torch.Tensor:
    x = x.contiguous()
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)  # contiguous whatever x's strides were
    dist.all_to_all_single(out, x, group=group)
    return out


def seq_to_heads(x: torch.Tensor, sp: SequenceParallel) -> torch.Tensor:
    """(h, L, D) all heads of this rank's L tokens -> (h / size, N, D) this rank's heads of all N tokens."""
    h, seq, dim = x.shape
    chunks = x.reshape(sp.size, h // sp.size, seq, dim)  # chunk i: the heads rank i will own
    got = _AllToAll.apply(chunks, sp.group)  # chunk i: my heads of rank i's tokens
    return got.permute(1, 0, 2, 3).reshape(h // sp.size, sp.size * seq, dim)


def heads_to_seq(x: torch.Tensor, sp: SequenceParallel) -> torch.Tensor:
    """Inverse of `seq_to_heads`: (h / size, N, D) -> (h, L, D)."""
    hs, n, dim = x.shape
    chunks = x.reshape(hs, sp.size, n // sp.size, dim).permute(1, 0, 2, 3)  # chunk i: rank i's tokens
    got = _AllToAll.apply(chunks, sp.group)  # chunk i: head block i of my tokens
    return got.reshape(sp.size * hs, n // sp.size, dim)


class _GatherSequence(torch.autograd.Function):
    """All-gather along dim 0; backward keeps this rank's slice, times the group size (module docstring)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, sp: SequenceParallel) -> torch.Tensor:
        ctx.sp = sp
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(sp.size)]
        dist.all_gather(parts, x, group=sp.group)
        return torch.cat(parts)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        sp = ctx.sp
        own = grad.chunk(sp.size)[sp.rank]
        return own * sp.size, None


def gather_sequence(x: torch.Tensor, sp: SequenceParallel) -> torch.Tensor:
    """(L, ...) per-token values of this rank's slice -> (N, ...) values of the whole row, in order."""
    return _GatherSequence.apply(x, sp)


@dataclass(frozen=True)
class PackedShard:
    """This rank's slice of a packed row and what attention needs of the whole row.

    Attributes:
        input_ids: (1, L) token ids of the slice. position_ids: (1, L) their positions ((3, 1, L) mrope).
        start: index of the slice's first token in the padded row (rank * L).
        seqs: sequence layout of the padded row of N = size * L tokens; the padding appended to the row is one
            more sequence.
        sp: the SP group.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    start: int
    seqs: PackedSequences
    sp: SequenceParallel

    @property
    def length(self) -> int:
        return self.input_ids.shape[1]

    @property
    def bounds(self) -> tuple[int, ...]:
        """(S + 1,) sequence boundaries in the padded row, 0 first, N last."""
        return self.seqs.bounds


def pad_packed_row(packed_ids: torch.Tensor, packed_pos: torch.Tensor, size: int
                   ) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Pad a packed row to a multiple of `size` tokens: ids 0, positions 0, 1, ... (on every mrope axis).

    Args:
        packed_ids: (1, N0). packed_pos: (1, N0), or (3, 1, N0) mrope positions.

    Returns:
        (1, N) ids, positions of the same layout (.., N), the number of pad tokens appended.
    """
    pad = -packed_ids.shape[1] % size
    ids = F.pad(packed_ids, (0, pad))
    tail = torch.arange(pad, device=packed_pos.device, dtype=packed_pos.dtype)
    pos = torch.cat([packed_pos, tail.expand(*packed_pos.shape[:-1], pad)], -1)
    return ids, pos, pad


def shard_packed_row(packed_ids: torch.Tensor, packed_pos: torch.Tensor, seq_lens: torch.Tensor,
                     sp: SequenceParallel) -> PackedShard:
    """Pad a packed row to a multiple of the group size and keep this rank's slice.

    Args:
        packed_ids: (1, N0) real tokens, sequence after sequence (`rlpost.utils.padding.unpad_input`).
        packed_pos: (1, N0) their position ids (restarting at 0 per sequence), or (3, 1, N0) mrope positions.
        seq_lens: (S,) real tokens of each sequence, in packing order (rows with 0 tokens allowed).

    Returns:
        the `PackedShard` of this rank (`pad_packed_row`'s padding).
    """
    ids, pos, pad = pad_packed_row(packed_ids, packed_pos, sp.size)
    seqs = packed_sequences([*seq_lens.tolist(), pad], packed_ids.device)
    local = ids.shape[1] // sp.size
    start = sp.rank * local
    return PackedShard(ids[:, start:start + local], pos[..., start:start + local], start, seqs, sp)


def _repeat_kv_for_group(key: torch.Tensor, value: torch.Tensor, size: int
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """(1, G, L, D) KV -> (1, lcm(G, size), L, D), each head repeated in place, so the heads split evenly over
    the group and every rank's query heads find their own KV heads (the query heads must divide by lcm)."""
    rep = size // math.gcd(key.shape[1], size)
    if rep == 1:
        return key, value
    return key.repeat_interleave(rep, dim=1), value.repeat_interleave(rep, dim=1)


def ulysses_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                      **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers attention function: Ulysses attention when the forward carries a `PackedShard`.

    Args:
        query: (1, H, L, D) after rotary embedding; key: (1, G, L, D), value: (1, G, L, Dv).
        attention_mask: unused with a shard (the sequence bounds define the mask); else as for SDPA.
        kwargs: `ulysses_shard` (the `PackedShard` of this forward) or None (then `packed_attention`), the
            module's attention options (sliding window, soft-cap, sinks: `attend_packed`), plus transformers' own.

    Returns:
        ((1, L, H, Dv) attention output, None).
    """
    shard: PackedShard | None = kwargs.pop(SHARD_KWARG, None)
    if shard is None:
        return packed_attention(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                **kwargs)
    opts = attention_options(kwargs)
    sp = shard.sp
    if opts["sinks"] is not None:  # one sink logit per query head: keep this rank's heads
        opts["sinks"] = opts["sinks"].chunk(sp.size)[sp.rank]
    key, value = _repeat_kv_for_group(key, value, sp.size)
    q, k, v = (seq_to_heads(t[0], sp) for t in (query, key, value))
    out = attend_packed(q, k, v, shard.seqs, dropout, scaling, **opts)  # (N, h / size, Dv)
    return heads_to_seq(out.transpose(0, 1), sp).transpose(0, 1)[None], None


def use_ulysses_attention(model: torch.nn.Module, size: int) -> None:
    """Route `model`'s attention through `ulysses_attention` for groups of `size` ranks (registered once per
    process; calls without a shard go to `packed_attention`).

    Raises:
        ValueError: the attention heads do not split over `size` ranks, or the model does not dispatch
            attention through transformers' `AttentionInterface`.
        NotImplementedError: the model has linear-attention (recurrent) layers, whose state runs along the
            whole sequence and so cannot be split over ranks.
    """
    from rlpost.engine.linear_attention import recurrent_mixers

    heads = hf_model_of(model).config.get_text_config().num_attention_heads
    if heads % size:
        raise ValueError(f"ulysses_sequence_parallel_size={size} must divide the model's {heads} attention heads")
    if recurrent_mixers(model):
        raise NotImplementedError(f"not supported yet: ulysses_sequence_parallel_size={size} with a model that has "
                                  "linear-attention layers; set it to 1")
    select_attention(model, ATTENTION_NAME, ulysses_attention)
