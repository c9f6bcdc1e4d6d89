"""Bucketed all-gather of FSDP2 parameters: one collective per bucket of tensors instead of one per tensor.

With FSDP2 each state-dict entry is a DTensor sharded on dim 0 (`Shard(0)`, torch.chunk layout: the first
ranks hold ceil(d0 / n) rows, later ranks fewer or none). `DTensor.full_tensor()` is one all-gather per
entry; a 0.5B model has ~290 entries, so the weight sync pays ~290 collective launches. Here every rank packs
its shards of a bucket's entries into one flat buffer, each entry padded to its ceil(d0 / n)-row slot so all
ranks send the same number of elements, one `all_gather_into_tensor` moves the bucket, and each full entry
is cut back out of the gathered buffer. The values are exactly those of `full_tensor()` (pure data movement).

Entries that are not plain dim-0 shards over one mesh dimension (a replicated or 2-D sharded layout) fall
back to `full_tensor()`; entries on a one-rank mesh need no collective at all.
"""

from __future__ import annotations

from typing import Iterator

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.placement_types import Shard

Named = tuple[str, torch.Tensor]

# torch 2.13 renamed all_gather_into_tensor (same signature) and warns on the old name; older torch has only it.
all_gather_flat = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def _shard_dim(tensor: DTensor) -> int | None:
    """The mesh dimension `tensor` is dim-0 sharded over (all others replicated); None for another layout."""
    dims = [i for i, p in enumerate(tensor.placements) if isinstance(p, Shard)]
    if len(dims) != 1 or tensor.placements[dims[0]] != Shard(0) or tensor.dim() == 0:
        return None
    return dims[0]


def chunk_rows(rows: int, world: int) -> list[int]:
    """Rows each rank holds under torch.chunk sharding of `rows` over `world` ranks (trailing ranks may hold 0)."""
    per = -(-rows // world)
    return [max(0, min(per, rows - r * per)) for r in range(world)]


def _gather_bucket(bucket: list[tuple[str, torch.Tensor, DTensor]], group: dist.ProcessGroup,
                   world: int) -> Iterator[Named]:
    """All-gather one bucket of dim-0 shards (same group) with one collective; yield the full tensors.

    Args:
        bucket: (name, local shard (rows_r, *rest) already in the wanted dtype, the DTensor it came from).
    """
    # per entry: (padded rows per rank, elements per row)
    slots = [(-(-full.shape[0] // world), full.shape[1:].numel()) for _, _, full in bucket]
    per_rank = sum(rows * rest for rows, rest in slots)
    send = bucket[0][1].new_zeros(per_rank)
    offset = 0
    for (_, local, _), (rows, rest) in zip(bucket, slots):
        send[offset:offset + local.numel()] = local.reshape(-1)
        offset += rows * rest
    recv = send.new_empty(world * per_rank)
    all_gather_flat(recv, send, group=group)
    recv = recv.view(world, per_rank)
    offset = 0
    for (name, _, full), (rows, rest) in zip(bucket, slots):
        parts = [recv[r, offset:offset + n * rest] for r, n in enumerate(chunk_rows(full.shape[0], world)) if n]
        offset += rows * rest
        yield name, torch.cat(parts).view(full.shape)


def iter_full_bucketed(entries: Iterator[tuple[str, torch.Tensor]], dtype: torch.dtype | None,
                       bucket_bytes: int) -> Iterator[Named]:
    """Yield (name, full tensor) for state-dict `entries`, gathering up to `bucket_bytes` of full tensors
    (in `dtype`) per collective; every rank must consume the whole iterator, in the same order.

    Peak extra memory: about two buckets (the gathered buffer and the entries cut from it). An entry larger
    than `bucket_bytes` travels alone. Entries are yielded in state-dict order.
    """
    bucket: list[tuple[str, torch.Tensor, DTensor]] = []
    key, size = None, 0
    for name, tensor in entries:
        if isinstance(tensor, DTensor) and tensor.device_mesh.size() == 1:
            tensor = tensor.to_local()  # one shard holds everything: no collective
        dim = _shard_dim(tensor) if isinstance(tensor, DTensor) else None
        local = tensor.to_local() if dim is not None else None
        if local is not None and dtype is not None:
            local = local.to(dtype)  # cast before gathering: fp32 -> bf16 halves the bytes sent
        this_key = None if dim is None else (id(tensor.device_mesh), dim, local.dtype, local.device)
        nbytes = 0 if dim is None else tensor.numel() * local.element_size()
        if bucket and (this_key != key or size + nbytes > bucket_bytes):
            yield from _flush(bucket, key)
            bucket, size = [], 0
        if dim is None:
            yield name, full_entry(tensor, dtype)
            continue
        bucket.append((name, local, tensor))
        key, size = this_key, size + nbytes
    if bucket:
        yield from _flush(bucket, key)


def _flush(bucket: list[tuple[str, torch.Tensor, DTensor]], key: tuple) -> Iterator[Named]:
    mesh, dim = bucket[0][2].device_mesh, key[1]
    yield from _gather_bucket(bucket, mesh.get_group(dim), mesh.size(dim))


def full_entry(tensor: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    """One state-dict entry as a full tensor in `dtype`, with its own collective (`full_tensor()`)."""
    if isinstance(tensor, DTensor) and tensor.device_mesh.size() == 1:
        tensor = tensor.to_local()  # one shard holds everything: no collective, no DTensor dispatch
    if dtype is not None:
        tensor = tensor.to(dtype)  # cast the shard before gathering: fp32 -> bf16 halves the bytes sent
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
