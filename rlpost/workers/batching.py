"""Per-rank batching shared by the actor and the critic: micro-batches (fixed or by token count),
mini-batches with optional shuffling, loss weights that make gradient accumulation exact, and the rows a
rank's group (tensor-parallel peers, a Ulysses group) shares."""

from __future__ import annotations

from typing import Any

import torch

from rlpost import keys
from rlpost.protocol import DataProto
from rlpost.utils.distributed import gather_in_group
from rlpost.utils.seqlen_balancing import rearrange_micro_batches, reverse_indices

TensorDict = dict[str, torch.Tensor]


def rows_per_rank(prompts: int, n: int, dp: int, key: str) -> int:
    """A global batch size counted in prompts -> rows on each data-parallel rank: `prompts * n // dp`.

    Raises:
        ValueError: naming `key` when the rows do not split into a positive whole number per rank.
    """
    rows = int(prompts) * int(n)
    if rows % dp != 0 or rows // dp == 0:
        raise ValueError(f"{key}={prompts} x rollout.n={n} = {rows} rows must be a positive multiple of the "
                         f"data-parallel size {dp}")
    return rows // dp


def take(tensors: TensorDict, idx: list[int] | torch.Tensor) -> TensorDict:
    """Rows `idx` of every tensor."""
    index = torch.as_tensor(idx, dtype=torch.long)
    return {k: v[index] for k, v in tensors.items()}


def micro_batches(tensors: TensorDict, micro_size: int | None, use_dynamic_bsz: bool,
                  max_token_len: int) -> tuple[list[TensorDict], torch.Tensor | None]:
    """Split rows into micro-batches.

    Args:
        tensors: (B, ...) tensors; `attention_mask` (B, T) is used for token counts.
        micro_size: rows per micro-batch (fixed mode; may be None with use_dynamic_bsz).
        use_dynamic_bsz: pack by real-token count instead, at most `max_token_len` tokens per micro-batch.

    Returns:
        (micro-batches, rev) where `rev` restores the original row order of concatenated outputs
        (None in fixed mode, where the order is kept).
    """
    n = next(iter(tensors.values())).shape[0]
    if use_dynamic_bsz:
        groups = rearrange_micro_batches(tensors[keys.ATTENTION_MASK], int(max_token_len))
        return [take(tensors, g) for g in groups], reverse_indices(groups)
    if micro_size is None or micro_size <= 0:
        raise ValueError(f"micro batch size must be > 0 without dynamic batch size, got {micro_size}")
    return [{k: v[i:i + micro_size] for k, v in tensors.items()} for i in range(0, n, micro_size)], None


def mini_batches(tensors: TensorDict, mini_size: int, shuffle: bool, seed: int | None, epoch: int
                 ) -> list[TensorDict]:
    """Split the rank's rows into mini-batches of `mini_size` rows (one optimiser step each).

    With `shuffle` the rows are permuted first, by a generator seeded with `seed + epoch`, or by torch's
    global generator when `seed` is None (its state is part of every checkpoint).
    """
    n = next(iter(tensors.values())).shape[0]
    if mini_size <= 0 or n % mini_size != 0:
        raise ValueError(f"{n} rows on this rank are not divisible into mini-batches of {mini_size} rows "
                         "(ppo_mini_batch_size * rollout.n / dp_size)")
    if shuffle:
        gen = None if seed is None else torch.Generator().manual_seed(int(seed) + epoch)
        tensors = take(tensors, torch.randperm(n, generator=gen))
    return [{k: v[i:i + mini_size] for k, v in tensors.items()} for i in range(0, n, mini_size)]


def _all_reduce_sum(value: float) -> tuple[float, int]:
    """Sum of `value` over the default group and the group size (identity when not distributed)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return value, 1
    t = torch.tensor([float(value)], dtype=torch.float64)
    dist.all_reduce(t)
    return float(t.item()), dist.get_world_size()


def loss_weights(micros: list[TensorDict], loss_agg_mode: str, mask_key: str = keys.RESPONSE_MASK
                 ) -> tuple[list[float], list[float]]:
    """Factor for each micro loss so the accumulated gradient equals the full mini-batch's.

    token-mean weighs a micro-batch by its share of the response tokens, seq-* modes by its share of rows,
    both counted over all data-parallel ranks (FSDP averages gradients over ranks, hence the `world` factor).

    Returns:
        (grad weights, local metric weights), one per micro-batch; local ones sum to 1 on this rank.
    """
    if loss_agg_mode == "token-mean":  # one device->host read for all micro-batches
        sizes = [float(v) for v in torch.stack([m[mask_key].sum() for m in micros]).tolist()]
    else:
        sizes = [float(m[mask_key].shape[0]) for m in micros]
    local = sum(sizes)
    total, world = _all_reduce_sum(local)
    grad_w = [s * world / max(total, 1.0) for s in sizes]
    metric_w = [s / max(local, 1.0) for s in sizes]
    return grad_w, metric_w


def optimizer_step(module: torch.nn.Module, optimizer: torch.optim.Optimizer, grad_clip: float,
                   prefix: str) -> dict[str, float]:
    """Clip, then step unless the grad norm is not finite (the step is then skipped, warned and counted)."""
    import logging
    import math

    from rlpost.engine.fsdp import clip_grad_norm

    norm = float(clip_grad_norm(module, grad_clip).item())
    if not math.isfinite(norm):
        logging.getLogger(__name__).warning("%s: grad norm is %s, skipping this optimiser step", prefix, norm)
        optimizer.zero_grad(set_to_none=True)
        return {f"{prefix}/grad_norm": norm, f"{prefix}/grad_norm_nonfinite": 1.0}
    optimizer.step()
    return {f"{prefix}/grad_norm": norm, f"{prefix}/grad_norm_nonfinite": 0.0}


def _as_floats(values: dict[str, Any]) -> dict[str, float]:
    """Metric values (floats or 0-dim device tensors) -> floats with a single device->host read."""
    names = [k for k, v in values.items() if isinstance(v, torch.Tensor)]
    out = {k: float(v) for k, v in values.items() if k not in names}
    if names:
        read = torch.stack([values[k].detach().float().reshape(()) for k in names]).tolist()
        out.update(zip(names, (float(v) for v in read)))
    return out


def train_epochs(module: torch.nn.Module, optimizer: torch.optim.Optimizer, cfg: Any, tensors: TensorDict,
                 micro_loss: Any, prefix: str, mini_batch_rows: int, shuffle_seed: int | None, sp_size: int = 1,
                 defer_grad_sync: bool = False) -> dict[str, list[float]]:
    """`ppo_epochs` x mini-batches of accumulated micro-batch losses, one optimiser step per mini-batch.

    Args:
        cfg: actor or critic config (ppo_micro_batch_size_per_gpu, use_dynamic_bsz, ppo_max_token_len_per_gpu,
            ppo_epochs, shuffle, loss_agg_mode, grad_clip).
        tensors: this rank's rows.
        micro_loss: maps a micro-batch to (scalar loss, {metric: float or 0-dim tensor}).
        mini_batch_rows: rows per mini-batch on this rank (`rows_per_rank(ppo_mini_batch_size, n, dp)`).
        shuffle_seed: seed of the mini-batch shuffle (`mini_batches`); None: torch's global generator.
        sp_size: Ulysses group size; the ranks of a group share each micro-batch, so a dynamic micro-batch
            holds `ppo_max_token_len_per_gpu x sp_size` tokens.
        defer_grad_sync: `fsdp_config.use_no_sync_for_gradient_accumulation`: an FSDP2 module reduce-scatters
            its gradients once per mini-batch, after the last micro-batch, instead of after each (it holds
            the unsharded gradients, in fp32, meanwhile: fewer collectives, more memory).

    Returns:
        metric name -> one value per mini-batch (micro values weighted by their share).
    """
    mode = str(cfg.loss_agg_mode)
    metrics: dict[str, list[float]] = {}
    module.train()
    defer = defer_grad_sync and hasattr(module, "set_requires_gradient_sync")  # FSDP2; a plain module never syncs
    for epoch in range(int(cfg.ppo_epochs)):
        for mini in mini_batches(tensors, mini_batch_rows, bool(cfg.shuffle), shuffle_seed, epoch):
            micros, _ = micro_batches(mini, cfg.ppo_micro_batch_size_per_gpu, bool(cfg.use_dynamic_bsz),
                                      int(cfg.ppo_max_token_len_per_gpu) * sp_size)
            grad_w, metric_w = loss_weights(micros, mode)
            optimizer.zero_grad(set_to_none=True)
            step: dict[str, Any] = {}
            try:
                for i, (mb, gw, mw) in enumerate(zip(micros, grad_w, metric_w)):
                    if defer:
                        module.set_requires_gradient_sync(i == len(micros) - 1)
                    loss, m = micro_loss(mb)
                    (loss * gw).backward()
                    for k, v in m.items():
                        step[k] = step.get(k, 0.0) + v * mw
            finally:  # a micro-batch that raised must not leave the sync off for what follows
                if defer:
                    module.set_requires_gradient_sync(True)
            step = _as_floats(step)
            step.update(optimizer_step(module, optimizer, float(cfg.grad_clip), prefix))
            for k, v in step.items():
                metrics.setdefault(k, []).append(v)
    optimizer.zero_grad(set_to_none=True)
    return metrics


def group_rows(data: DataProto, group: Any, rank: int) -> tuple[DataProto, int]:
    """The rows of every member of `group` (in rank order) and the index of this rank's first row.

    Ranks that must process the same rows (tensor-parallel rollout peers, a Ulysses group) each receive their
    own shard from the trainer and gather their peers' shards here. `group` None: `data` itself, 0.
    """
    if group is None:
        return data, 0
    parts = gather_in_group(data, group)
    return DataProto.concat(parts), sum(len(p) for p in parts[:rank])


def own_rows(out: DataProto, start: int, rows: int) -> DataProto:
    """This rank's `rows` rows of a result computed on its group's rows (meta_info kept)."""
    if start == 0 and len(out) == rows:
        return out
    mine = out.slice(start, start + rows)
    mine.meta_info = out.meta_info
    return mine


def sp_parts(sp: Any) -> tuple[Any, int]:
    """(group, rank in it) of a Ulysses group (`SequenceParallel`) for `group_rows`; (None, 0) without one."""
    return (None, 0) if sp is None else (sp.group, sp.rank)
