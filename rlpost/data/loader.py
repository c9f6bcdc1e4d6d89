"""Samplers and a data loader that can save and restore its position (checkpoint resume).

torchdata's `StatefulDataLoader` is not a dependency; `ResumableLoader` offers the part of its API
the trainer uses: iterate, `len()`, `state_dict()`, `load_state_dict()`. The shuffle order of an epoch
depends only on (seed, epoch), so a restored loader replays exactly the batches it had not yet given.

A user sampler (`data.sampler.class_path` / `class_name`, e.g. a curriculum) is built as verl builds it,
`cls(data_source=dataset, data_config=data)`, and must define `__iter__` and `__len__`. Its indices are
drawn lazily, batch by batch, so a sampler may reorder what it has not yielded yet. On resume:
- a sampler with `state_dict()` / `load_state_dict()` owns its position: its state is saved with the
  loader's, and after `load_state_dict` its next `__iter__` must yield the rest of the interrupted epoch
  (torchdata's contract); the loader neither calls `set_epoch` nor skips anything then;
- any other sampler must give the same order for the same epoch (`set_epoch(epoch)` is called when it has
  one): the loader replays the epoch and skips the batches already consumed.
"""

from __future__ import annotations

import itertools
from typing import Any, Callable, Iterator

import torch
from torch.utils.data import DataLoader, Dataset, Sampler, SequentialSampler

from rlpost.data.rl_dataset import collate_fn as default_collate
from rlpost.data.rl_dataset import load_extern_class


class EpochSeededSampler(Sampler[int]):
    """Random permutation of `range(n)` drawn from a generator seeded with `seed + epoch`."""

    def __init__(self, num_samples: int, seed: int):
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
    """Training sampler: the user class of `data.sampler` when its class_path is set, else shuffled by
    `data.seed` when `data.train_shuffle`, else sequential.

    Raises:
        ValueError: a user sampler with `data.dataloader_num_workers` > 0 (worker processes fetch batches
            ahead, before a curriculum sampler could reorder them; verl has the same rule).
    """
    sampler_cfg = data_config.sampler
    if sampler_cfg.class_path is not None:
        if data_config.dataloader_num_workers != 0:
            raise ValueError(f"data.sampler.class_path={sampler_cfg.class_path} with data.dataloader_num_workers="
                             f"{data_config.dataloader_num_workers}: a custom sampler needs batches fetched when "
                             "they are used; use data.dataloader_num_workers=0")
        cls = load_extern_class(sampler_cfg.class_path, sampler_cfg.class_name, "data.sampler",
                                path_field="class_path", name_field="class_name")
        return cls(data_source=dataset, data_config=data_config)
    if data_config.train_shuffle:
        return EpochSeededSampler(len(dataset), seed=data_config.seed)
    return SequentialSampler(dataset)


def _stateful(sampler: Any) -> bool:
    return callable(getattr(sampler, "state_dict", None)) and callable(getattr(sampler, "load_state_dict", None))


class ResumableLoader:
    """Batches of `batch_size` indices from `sampler`; remembers (epoch, batches given, seed[, sampler state]).

    Args:
        dataset: map-style dataset.
        batch_size: rows per batch.
        sampler: `EpochSeededSampler`, a sampler with a fixed order, or a stateful sampler (module docstring).
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
        self._sampler_resumes = False  # a stateful sampler was restored mid-epoch: it skips by itself

    def __len__(self) -> int:
        n = len(self.sampler)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def _epoch_batches(self) -> Iterator[list[int]]:
        """This epoch's batches, each drawn from the sampler only when the previous one was used."""
        batch: list[int] = []
        for index in self.sampler:
            batch.append(int(index))
            if len(batch) == self.batch_size:
                yield batch
                batch = []
        if batch and not self.drop_last:
            yield batch

    def __iter__(self) -> Iterator[Any]:
        if self.batches_done >= len(self):  # the previous epoch was finished: start the next one
            self.epoch += 1
            self.batches_done = 0
            self._sampler_resumes = False
        if self._sampler_resumes:
            batches = self._epoch_batches()
        else:
            if hasattr(self.sampler, "set_epoch"):
                self.sampler.set_epoch(self.epoch)
            batches = itertools.islice(self._epoch_batches(), self.batches_done, None)
        self._sampler_resumes = False
        loader = DataLoader(self.dataset, batch_sampler=batches, collate_fn=self.collate_fn,
                            num_workers=self.num_workers)
        for batch in loader:
            self.batches_done += 1
            yield batch

    def state_dict(self) -> dict[str, Any]:
        """Position: `epoch`, `batches_done` within it, the sampler `seed` (-1 if unseeded) and, for a
        stateful sampler, its `state_dict()` under `sampler`."""
        state: dict[str, Any] = {"epoch": self.epoch, "batches_done": self.batches_done,
                                 "seed": int(getattr(self.sampler, "seed", -1))}
        if _stateful(self.sampler):
            state["sampler"] = self.sampler.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a saved position; the sampler seed must match the saved one."""
        seed = int(getattr(self.sampler, "seed", -1))
        if int(state["seed"]) != seed:
            raise ValueError(f"data loader state was saved with seed {state['seed']}, this sampler has {seed}")
        self.epoch = int(state["epoch"])
        self.batches_done = int(state["batches_done"])
        if "sampler" in state and _stateful(self.sampler):
            self.sampler.load_state_dict(state["sampler"])
            self._sampler_resumes = True


def create_train_loader(data_config: Any, dataset: Dataset, collate_fn: Callable | None = None) -> ResumableLoader:
    """Train loader: `data.train_batch_size` prompts per batch, `create_rl_sampler`, last partial
    batch dropped, `data.dataloader_num_workers` worker processes."""
    return ResumableLoader(dataset, int(data_config.train_batch_size), create_rl_sampler(data_config, dataset),
                           collate_fn, drop_last=True, num_workers=int(data_config.dataloader_num_workers))


def create_val_loader(data_config: Any, dataset: Dataset, collate_fn: Callable | None = None) -> ResumableLoader:
    """Validation loader: `data.val_batch_size` (null: the whole set in one batch), shuffled with
    `data.seed` only if `data.val_shuffle`; no row dropped."""
    if len(dataset) == 0:  # else the loader's own "batch_size must be >= 1, got 0", naming no key
        raise ValueError(f"data.val_files={data_config.val_files}: no validation rows"
                         + (" left after filter_overlong_prompts" if data_config.filter_overlong_prompts else "")
                         + "; give a file with prompts, or data.val_files=null to skip validation")
    size = data_config.val_batch_size or len(dataset)
    sampler = (EpochSeededSampler(len(dataset), data_config.seed) if data_config.val_shuffle
               else SequentialSampler(dataset))
    return ResumableLoader(dataset, int(size), sampler, collate_fn, drop_last=False)
