"""Dynamic batch size: split rows into micro-batches of at most `max_token_len` real tokens each.

Rows are spread over the fewest micro-batches that fit (largest row first into the lightest micro-batch),
so micro-batches carry similar token counts. Under FSDP every rank must run the same number of forwards
(each forward all-gathers parameters), so the count is the max over the data-parallel group.
"""

from __future__ import annotations

import copy
import heapq
import math
from typing import Any

import torch


def partition_balanced(lengths: list[int], k: int) -> list[list[int]]:
    """Greedy longest-first partition of row indices into `k` non-empty groups with balanced sums.

    Args:
        lengths: token count of each row (len n >= k).
        k: number of groups.

    Returns:
        k lists of row indices, each sorted ascending.
    """
    if not 1 <= k <= len(lengths):
        raise ValueError(f"cannot split {len(lengths)} rows into {k} micro-batches")
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    groups: list[list[int]] = [[] for _ in range(k)]
    # The first k rows seed the k groups so none stays empty; then lightest group takes the next row.
    heap = []
    for g, i in enumerate(order[:k]):
        groups[g].append(i)
        heap.append((lengths[i], g))
    heapq.heapify(heap)
    for i in order[k:]:
        total, g = heapq.heappop(heap)
        groups[g].append(i)
        heapq.heappush(heap, (total + lengths[i], g))
    return [sorted(g) for g in groups]


def _sync_max(value: int, group: Any = None) -> int:
    """Max of `value` over `group` (the default process group when None; identity when not distributed)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(group) == 1:
        return value
    t = torch.tensor([value], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return int(t.item())


def rearrange_micro_batches(
    attention_mask: torch.Tensor, max_token_len: int, sync_dp: bool = True, group: Any = None
) -> list[list[int]]:
    """Row indices of each micro-batch so that no micro-batch holds more than `max_token_len` real tokens.

    Args:
        attention_mask: (B, T) 1 on real tokens.
        max_token_len: token budget per micro-batch (ppo_max_token_len_per_gpu and variants).
        sync_dp: make every rank use the same (max) number of micro-batches.
        group: the process group of those ranks (None: the default group).

    Returns:
        list of micro-batches, each a list of row indices; together a permutation of range(B).
    """
    lengths = attention_mask.sum(dim=-1).tolist()
    lengths = [int(x) for x in lengths]
    if max(lengths) > max_token_len:
        raise ValueError(
            f"a row has {max(lengths)} tokens > max_token_len={max_token_len}; raise the *_max_token_len_per_gpu "
            f"key to at least {max(lengths)}"
        )
    k = max(1, math.ceil(sum(lengths) / max_token_len))
    while True:
        k_used = _sync_max(k, group) if sync_dp else k
        k_used = min(k_used, len(lengths))
        groups = partition_balanced(lengths, k_used)
        fits = all(sum(lengths[i] for i in g) <= max_token_len for g in groups)
        # Every rank must agree on leaving the loop, or the collectives above would fall out of step.
        done = _sync_max(0 if fits else 1, group) == 0 if sync_dp else fits
        if done:
            return groups
        k = k_used + 1


def reverse_indices(groups: list[list[int]]) -> torch.Tensor:
    """Permutation that restores the original row order after concatenating the micro-batch outputs.

    Returns:
        (B,) long tensor `rev` with `torch.cat(outputs)[rev]` in the original order.
    """
    flat = torch.tensor([i for g in groups for i in g], dtype=torch.long)
    rev = torch.empty_like(flat)
    rev[flat] = torch.arange(len(flat))
    return rev


def balanced_partition_order(lengths: list[int], k: int) -> tuple[list[int], float]:
    """Row order that gives `k` equal-size contiguous chunks with balanced token sums (trainer.balance_batch).

    Rows are taken longest first, each into the chunk with the smallest sum that still has room. The
    worker group splits a batch into k equal contiguous chunks, so concatenating the groups is the order.

    Returns:
        (order, spread): the permutation (len n) and (max - min) / mean of the chunk token sums.
    """
    n = len(lengths)
    if n % k:
        raise ValueError(f"balance_batch: {n} rows do not split into {k} equal chunks")
    groups = _equal_size_groups(lengths, k)
    sums = [sum(lengths[i] for i in g) for g in groups]
    mean = sum(sums) / k if k else 0.0
    spread = (max(sums) - min(sums)) / mean if mean else 0.0
    return [i for g in groups for i in g], spread


def _equal_size_groups(lengths: list[int], k: int) -> list[list[int]]:
    """`k` groups of len(lengths) / k row indices (each sorted), longest row first into the group with the
    smallest sum that still has room."""
    size = len(lengths) // k
    groups: list[list[int]] = [[] for _ in range(k)]
    sums = [0] * k
    for i in sorted(range(len(lengths)), key=lambda j: -lengths[j]):
        g = min((g for g in range(k) if len(groups[g]) < size), key=lambda g: sums[g])
        groups[g].append(i)
        sums[g] += lengths[i]
    return [sorted(g) for g in groups]


def get_seqlen_balanced_partitions(seqlen_list: list[int], k_partitions: int, equal_size: bool) -> list[list[int]]:
    """verl's name: `k_partitions` lists of row indices with balanced token sums (each list sorted);
    `equal_size` gives every list len(seqlen_list) / k_partitions rows (which must divide).

    The split is greedy longest-first (verl uses Karmarkar-Karp): same contract, not always the same lists.
    """
    if equal_size:
        if len(seqlen_list) % k_partitions:
            raise ValueError(f"{len(seqlen_list)} rows do not split into {k_partitions} equal partitions")
        return _equal_size_groups(list(seqlen_list), k_partitions)
    return partition_balanced(list(seqlen_list), k_partitions)


def log_seqlen_unbalance(seqlen_list: list[int], partitions: list[list[int]], prefix: str) -> dict[str, float]:
    """Token sums per partition before (contiguous equal chunks, as the rows came) and after balancing:
    `{prefix}/min`, `/max`, `/minmax_diff` (before), `/balanced_min`, `/balanced_max` (after), `/mean`."""
    k = len(partitions)
    size = len(seqlen_list) // k
    before = [sum(seqlen_list[j * size:(j + 1) * size]) for j in range(k)]
    after = [sum(seqlen_list[i] for i in p) for p in partitions]
    return {f"{prefix}/min": min(before), f"{prefix}/max": max(before),
            f"{prefix}/minmax_diff": max(before) - min(before), f"{prefix}/balanced_min": min(after),
            f"{prefix}/balanced_max": max(after), f"{prefix}/mean": sum(seqlen_list) / k}


def ceildiv(a: int, b: int) -> int:
    """ceil(a / b) for integers (ceildiv(7, 3) == 3)."""
    return -(a // -b)


def roundup_divisible(a: int, b: int) -> int:
    """The smallest multiple of b that is >= a (roundup_divisible(7, 4) == 8)."""
    return ceildiv(a, b) * b


def calculate_workload(seqlen_list: torch.Tensor) -> torch.Tensor:
    """Relative cost of rows of these lengths through a dense transformer: the linear layers grow with the length,
    attention with its square (24576 * s + s^2, verl's weights for a 4096-wide model)."""
    return 24576 * seqlen_list + seqlen_list**2


def get_reverse_idx(idx_map: list[int]) -> list[int]:
    """The inverse permutation: out[idx_map[i]] = i."""
    out = list(idx_map)
    for i, j in enumerate(idx_map):
        out[j] = i
    return out


def prepare_dynamic_batch(
    data: Any,
    max_token_len: int,
    dp_group: Any = None,
    num_batches_divided_by: int | None = None,
    same_micro_num_in_dp: bool = True,
    min_num_micro_batch: int | None = None,
    use_dynamic_bsz_balance: bool = True,
) -> tuple[list[Any], list[list[int]]]:
    """A DataProto cut into micro-batches of at most `max_token_len` real tokens (its `attention_mask`).

    Args:
        data: the DataProto (reads batch["attention_mask"]).
        max_token_len: token budget per micro-batch.
        dp_group: the data-parallel group whose ranks agree on the micro-batch count (same_micro_num_in_dp).
        num_batches_divided_by: round the count up to a multiple of this (pipeline schedules).
        min_num_micro_batch: at least this many micro-batches.
        use_dynamic_bsz_balance: order the micro-batches heaviest in the middle, lightest at both ends
            (the order pipeline warm-up and cool-down expose least).

    Returns:
        (micro-batches as DataProtos with a copy of meta_info each, the row indices of each); pass the indices to
        `restore_dynamic_batch` to put concatenated outputs back in row order.
    """
    from rlpost.protocol import DataProto  # the batch type; utils otherwise stay below the protocol

    mask = data.batch["attention_mask"]
    lengths = [int(x) for x in mask.sum(dim=-1).tolist()]
    groups = rearrange_micro_batches(mask, max_token_len, sync_dp=same_micro_num_in_dp, group=dp_group)
    k = max(len(groups), min_num_micro_batch or 0)
    if num_batches_divided_by:
        k = roundup_divisible(k, num_batches_divided_by)
    if k > len(lengths):
        raise ValueError(f"prepare_dynamic_batch: {k} micro-batches asked of {len(lengths)} rows")
    if k != len(groups):  # more, smaller micro-batches still fit the budget
        groups = partition_balanced(lengths, k)
    if use_dynamic_bsz_balance:
        work = calculate_workload(torch.tensor(lengths, dtype=torch.float64)).tolist()
        groups.sort(key=lambda g: (sum(work[i] for i in g), g[0] if g else 0), reverse=True)
        groups = groups[::2][::-1] + groups[1::2]
    micro = []
    for g in groups:
        rows = data.select_idxs(g)
        micro.append(DataProto(rows.batch, rows.non_tensor_batch, copy.deepcopy(data.meta_info)))
    return micro, groups


def restore_dynamic_batch(data: torch.Tensor, batch_idx_list: list[list[int]]) -> torch.Tensor:
    """Rows of the concatenated micro-batch outputs (B, ...) back in the original row order (nested tensors too)."""
    order = [i for g in batch_idx_list for i in g]
    if len(order) != data.shape[0]:
        raise ValueError(f"restore_dynamic_batch: the index lists hold {len(order)} rows, the data {data.shape[0]}")
    reverse = get_reverse_idx(order)
    if data.is_nested:
        parts = data.unbind()
        return torch.nested.as_nested_tensor([parts[i] for i in reverse], layout=torch.jagged)
    return data[torch.tensor(reverse, dtype=torch.long)]


def get_group_balanced_partitions(seqlen_list: list[int], uid_list: list, k_partitions: int) -> list[list[int]]:
    """`k_partitions` lists of row indices (each sorted) that keep the rows of one uid together.

    Rows of one uid must be contiguous (as `repeat(interleave=True)` leaves them); groups are spread with an
    equal number of groups per partition, balancing the groups' summed `calculate_workload`.
    """
    if len(seqlen_list) != len(uid_list):
        raise ValueError(f"get_group_balanced_partitions: {len(seqlen_list)} lengths but {len(uid_list)} uids")
    groups: list[list[int]] = []
    for i, uid in enumerate(uid_list):
        if groups and uid_list[groups[-1][0]] == uid:
            groups[-1].append(i)
        else:
            groups.append([i])
    if len(groups) < k_partitions:
        raise ValueError(f"get_group_balanced_partitions: {len(groups)} uid groups cannot fill {k_partitions} "
                         "partitions; lower the world size or raise the batch size")
    work = [int(sum(calculate_workload(torch.tensor(seqlen_list[i])).item() for i in g)) for g in groups]
    parts = get_seqlen_balanced_partitions(work, k_partitions, equal_size=True)
    return [sorted(i for g in part for i in groups[g]) for part in parts]
