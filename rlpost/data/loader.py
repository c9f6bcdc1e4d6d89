"""Samplers and a data loader that can save and restore its position (checkpoint resume).

torchdata's `StatefulDataLoader` is not a dependency; `ResumableLoader` offers the part of its API
the trainer uses: iterate, `len()`, `state_dict()`, `load_state_dict()`. The shuffle order of an epoch
depends only on (seed, epoch), so a restored loader replays exactly the batches it had not yet given.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

import torch
from torch.utils.data import DataLoader, Dataset, Sampler, SequentialSampler

from rlpost.data.rl_dataset import collate_fn as default_collate


class EpochSeededSampler(Sampler[int]):
    """Random permutation of `range(n)` drawn from a generator seeded with `seed + epoch`."""

    def __init__(self, num_samples: int, seed: int = 1):
        self.num_samples = num_samples
        self.seed = int(seed)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        gen = torch.Generator().manual_seed(self.seed + self.epoch)
        return iter(torch.randperm(self.num_samples, generator=gen).tolist())

    def __len__(self) -> int:
        return self.num_samples


def create_rl_sampler(data_config: Any, dataset: Dataset) -> Sampler[int]:
    """Training sampler: shuffled by `data.seed` (default 1) when `data.shuffle` (default True), else
    sequential."""
    shuffle = data_config.get("shuffle", True)
    if shuffle:
        return EpochSeededSampler(len(dataset), seed=data_config.get("seed", None) or 1)
    return SequentialSampler(dataset)


class ResumableLoader:
    """Batches of `batch_size` indices from `sampler`; remembers (epoch, batches given, seed).

    Args:
        dataset: map-style dataset.
        batch_size: rows per batch.
        sampler: `EpochSeededSampler` or any sampler with a fixed order.
        collate_fn: list of items -> batch (default: `rl_dataset.collate_fn`).
        drop_last: drop a last, smaller batch.
        num_workers: worker processes of the underlying torch `DataLoader`.
    """

    def __init__(self, dataset: Dataset, batch_size: int, sampler: Sampler[int] | None = None,
                 collate_fn: Callable[[list], Any] | None = None, drop_last: bool = True, num_workers: int = 0):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.dataset = dataset
        self.batch_size = batch_size
        self.sampler = sampler if sampler is not None else SequentialSampler(dataset)
        self.collate_fn = collate_fn or default_collate
        self.drop_last = drop_last
        self.num_workers = num_workers
        self.epoch = 0
        self.batches_done = 0  # batches already yielded in `self.epoch`

    def __len__(self) -> int:
        n = len(self.sampler)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def _epoch_batches(self) -> list[list[int]]:
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(self.epoch)
        order = list(iter(self.sampler))
        batches = [order[i : i + self.batch_size] for i in range(0, len(order), self.batch_size)]
        if self.drop_last and batches and len(batches[-1]) < self.batch_size:
            batches.pop()
        return batches

    def __iter__(self) -> Iterator[Any]:
        if self.batches_done >= len(self):  # the previous epoch was finished: start the next one
            self.epoch += 1
            self.batches_done = 0
        remaining = self._epoch_batches()[self.batches_done :]
        loader = DataLoader(self.dataset, batch_sampler=remaining, collate_fn=self.collate_fn,
                            num_workers=self.num_workers)
        for batch in loader:
            self.batches_done += 1
            yield batch

    def state_dict(self) -> dict[str, int]:
        """Position: `epoch`, `batches_done` within it, and the sampler `seed` (-1 if unseeded)."""
        return {"epoch": self.epoch, "batches_done": self.batches_done,
                "seed": int(getattr(self.sampler, "seed", -1))}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continue from a saved position; the sampler seed must match the saved one."""
        seed = int(getattr(self.sampler, "seed", -1))
        if int(state.get("seed", seed)) != seed:
            raise ValueError(f"data loader state was saved with seed {state['seed']}, this sampler has {seed}")
        self.epoch = int(state["epoch"])
        self.batches_done = int(state["batches_done"])


def create_train_loader(data_config: Any, dataset: Dataset, collate_fn: Callable | None = None) -> ResumableLoader:
    """Train loader: `data.train_batch_size` prompts per batch, `create_rl_sampler`, last partial
    batch dropped, `data.dataloader_num_workers` workers (default 0)."""
    return ResumableLoader(dataset, int(data_config.get("train_batch_size")), create_rl_sampler(data_config, dataset),
                           collate_fn, drop_last=True, num_workers=int(data_config.get("dataloader_num_workers", 0) or 0))


def create_val_loader(data_config: Any, dataset: Dataset, collate_fn: Callable | None = None) -> ResumableLoader:
    """Validation loader: `data.val_batch_size` (null: the whole set in one batch), shuffled with
    `data.seed` only if `data.validation_shuffle`; no row dropped."""
    size = data_config.get("val_batch_size", None) or len(dataset)
    sampler = (EpochSeededSampler(len(dataset), data_config.get("seed", None) or 1)
               if data_config.get("validation_shuffle", False) else SequentialSampler(dataset))
    return ResumableLoader(dataset, int(size), sampler, collate_fn, drop_last=False)
