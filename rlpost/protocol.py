"""`DataProto`: the batch passed between the driver and the workers.

A `DataProto` holds three things about B rows:
- `batch`: tensors, every one of shape (B, ...), in a plain dict (`TensorBatch`);
- `non_tensor_batch`: numpy arrays (usually dtype=object), every one of shape (B, ...);
- `meta_info`: a free dict that is not split by row (temperatures, metrics, flags).

No Ray, vLLM or torch.distributed imports here: `DataProtoFuture.get` imports Ray lazily.
"""

from __future__ import annotations

import copy
import pickle
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch

from rlpost.keys import META_METRICS

IndexLike = Sequence[int] | np.ndarray | torch.Tensor


class TensorBatch(dict):
    """A `dict[str, Tensor]` whose tensors share dim 0; `batch_size` mirrors tensordict's attribute."""

    @property
    def batch_size(self) -> torch.Size:
        """torch.Size([B]), or torch.Size([0]) when empty."""
        for value in self.values():
            return torch.Size([value.shape[0]])
        return torch.Size([0])


def _as_object_array(values: list) -> np.ndarray:
    """A 1-D object array holding `values` element by element (nested lists stay Python lists)."""
    arr = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):
        arr[i] = v
    return arr


def _values_equal(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return len(a) == len(b) and all(_values_equal(x, y) for x, y in zip(a, b))
    return bool(a == b)


def _compact(t: torch.Tensor) -> torch.Tensor:
    """Clone a view whose storage is larger than the view, so pickling sends only its own bytes."""
    if t.untyped_storage().nbytes() > t.numel() * t.element_size():
        return t.clone()
    return t


# dtypes numpy lacks (bf16, float8, ...) travel as integers of the same width
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


@dataclass(frozen=True, eq=False)
class _WireTensor:
    """A CPU tensor pickled as a numpy array: under pickle protocol 5 (Ray) the array's buffer goes out of
    band, copied once into shared memory, where torch pickles a storage through `torch.save` (~3x slower for a
    main_ppo batch). A view sends only its own bytes.

    Within one process, protocol 5 with the sender's own (writable) buffers would give tensors sharing the
    sender's memory; Ray's buffers are read-only, and in-band pickles (protocol 4, `save_to_disk`) copy.
    """

    array: np.ndarray
    dtype: torch.dtype

    def tensor(self) -> torch.Tensor:
        # Ray hands back read-only arrays over its shared memory: copy those, so the tensor owns writable memory
        array = self.array if self.array.flags.writeable else self.array.copy()
        t = torch.from_numpy(array)
        return t if t.dtype == self.dtype else t.view(self.dtype)


def _to_wire(t: torch.Tensor) -> torch.Tensor | _WireTensor:
    # torch's own pickling: device tensors, autograd leaves, lazy conj/neg views, and broadcast (stride-0) views,
    # whose storage is smaller than the tensor (numpy would send every element)
    if t.device.type != "cpu" or t.requires_grad or t.is_conj() or t.is_neg() or 0 in t.stride():
        return _compact(t)
    try:
        return _WireTensor(t.numpy(), t.dtype)
    except TypeError:  # a dtype numpy has no type for: its bits as an integer type of the same width
        bits = _BITS.get(t.element_size())
        return _WireTensor(t.view(bits).numpy(), t.dtype) if bits is not None else _compact(t)


def _from_wire(value: torch.Tensor | _WireTensor) -> torch.Tensor:
    return value.tensor() if isinstance(value, _WireTensor) else value


@dataclass
class DataProtoItem:
    """One row of a `DataProto`: tensors without the batch dim, the row's non-tensor values."""

    batch: dict[str, torch.Tensor]
    non_tensor_batch: dict[str, Any]
    meta_info: dict = field(default_factory=dict)


@dataclass
class DataProto:
    """Rows of tensors and numpy arrays sharing dim 0, plus row-independent `meta_info`."""

    batch: TensorBatch = field(default_factory=TensorBatch)
    non_tensor_batch: dict[str, np.ndarray] = field(default_factory=dict)
    meta_info: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.batch is None:
            self.batch = TensorBatch()
        elif not isinstance(self.batch, TensorBatch):
            self.batch = TensorBatch(self.batch)
        self.non_tensor_batch = {
            k: (v if isinstance(v, np.ndarray) else _as_object_array(list(v)))
            for k, v in (self.non_tensor_batch or {}).items()
        }
        self.meta_info = dict(self.meta_info or {})
        self.check_consistency()

    # ---- construction -------------------------------------------------------------------------
    @classmethod
    def from_dict(
        cls,
        tensors: dict[str, torch.Tensor] | None = None,
        non_tensors: dict[str, np.ndarray | list] | None = None,
        meta_info: dict | None = None,
    ) -> DataProto:
        """Build from tensors (B, ...) and numpy arrays / lists of length B."""
        return cls(TensorBatch(tensors or {}), dict(non_tensors or {}), dict(meta_info or {}))

    @classmethod
    def from_single_dict(cls, data: dict[str, Any], meta_info: dict | None = None) -> DataProto:
        """Build from one dict: tensors go to `batch`, numpy arrays and lists to `non_tensor_batch`."""
        tensors, non_tensors = {}, {}
        for key, value in data.items():
            if isinstance(value, torch.Tensor):
                tensors[key] = value
            elif isinstance(value, (np.ndarray, list, tuple)):
                non_tensors[key] = value
            else:
                raise TypeError(f"DataProto.from_single_dict: key {key!r} has unsupported type {type(value)}")
        return cls.from_dict(tensors, non_tensors, meta_info)

    def check_consistency(self) -> None:
        """Raise ValueError naming the key when tensors/arrays do not share dim 0."""
        n = None
        for kind, store in (("batch", self.batch), ("non_tensor_batch", self.non_tensor_batch)):
            for key, value in store.items():
                if value.ndim == 0:
                    raise ValueError(f"DataProto.{kind}[{key!r}] is a scalar; it needs a batch dim")
                if n is None:
                    n, first = value.shape[0], key
                elif value.shape[0] != n:
                    raise ValueError(
                        f"DataProto.{kind}[{key!r}] has {value.shape[0]} rows but {first!r} has {n}"
                    )

    def __len__(self) -> int:
        for store in (self.batch, self.non_tensor_batch):
            for value in store.values():
                return int(value.shape[0])
        return 0

    # ---- row selection ------------------------------------------------------------------------
    def _take(self, index: Any) -> DataProto:
        """Rows `index` (slice or 1-D int index) of every field; meta_info is copied shallowly."""
        batch = {k: v[index] for k, v in self.batch.items()}
        np_index = index.cpu().numpy() if isinstance(index, torch.Tensor) else index
        non_tensor = {k: v[np_index] for k, v in self.non_tensor_batch.items()}
        return DataProto(TensorBatch(batch), non_tensor, dict(self.meta_info))

    def select_idxs(self, idxs: IndexLike) -> DataProto:
        """Rows at integer positions or where a boolean mask (B,) is True."""
        idx = torch.as_tensor(np.asarray(idxs) if not isinstance(idxs, torch.Tensor) else idxs)
        if idx.dtype == torch.bool:
            if idx.numel() != len(self):
                raise ValueError(f"boolean mask has {idx.numel()} entries for {len(self)} rows")
            idx = idx.nonzero().flatten()
        return self._take(idx.long().reshape(-1))

    def slice(self, start: int | None = None, end: int | None = None, step: int | None = None) -> DataProto:
        """Rows start:end:step (views, no copy)."""
        return self._take(slice(start, end, step))

    def __getitem__(self, item: Any) -> DataProto | DataProtoItem:
        if isinstance(item, slice):
            return self._take(item)
        if isinstance(item, (int, np.integer)):
            return DataProtoItem(
                {k: v[item] for k, v in self.batch.items()},
                {k: v[item] for k, v in self.non_tensor_batch.items()},
                self.meta_info,
            )
        if isinstance(item, (list, tuple, np.ndarray, torch.Tensor)):
            return self.select_idxs(item)
        raise TypeError(f"DataProto index of type {type(item)} is not supported")

    def reorder(self, indices: torch.Tensor) -> None:
        """Permute the rows in place: row i becomes old row indices[i]."""
        reordered = self.select_idxs(indices)
        self.batch, self.non_tensor_batch = reordered.batch, reordered.non_tensor_batch

    # ---- key selection ------------------------------------------------------------------------
    def select(
        self,
        batch_keys: Sequence[str] | None = None,
        non_tensor_batch_keys: Sequence[str] | None = None,
        meta_info_keys: Sequence[str] | None = None,
        deepcopy: bool = False,
    ) -> DataProto:
        """A DataProto with only the named keys (None = all keys of that part); tensors are shared."""

        def pick(store: dict, keys: Sequence[str] | None, part: str) -> dict:
            if keys is None:
                return dict(store)
            missing = [k for k in keys if k not in store]
            if missing:
                raise KeyError(f"DataProto.select: {part} has no key(s) {missing}; it has {sorted(store)}")
            return {k: store[k] for k in keys}

        out = DataProto(
            TensorBatch(pick(self.batch, batch_keys, "batch")),
            pick(self.non_tensor_batch, non_tensor_batch_keys, "non_tensor_batch"),
            pick(self.meta_info, meta_info_keys, "meta_info"),
        )
        return copy.deepcopy(out) if deepcopy else out

    def pop(
        self,
        batch_keys: Sequence[str] | None = None,
        non_tensor_batch_keys: Sequence[str] | None = None,
        meta_info_keys: Sequence[str] | None = None,
    ) -> DataProto:
        """Remove the named keys (None = none) from self and return them as a new DataProto."""
        out = self.select(batch_keys or [], non_tensor_batch_keys or [], meta_info_keys or [])
        for key in batch_keys or []:
            del self.batch[key]
        for key in non_tensor_batch_keys or []:
            del self.non_tensor_batch[key]
        for key in meta_info_keys or []:
            del self.meta_info[key]
        return out

    def rename(self, old_keys: str | Sequence[str], new_keys: str | Sequence[str]) -> DataProto:
        """Rename batch (tensor) keys in place; returns self."""
        old = [old_keys] if isinstance(old_keys, str) else list(old_keys)
        new = [new_keys] if isinstance(new_keys, str) else list(new_keys)
        if len(old) != len(new):
            raise ValueError(f"rename: {len(old)} old keys but {len(new)} new keys")
        values = [self.batch.pop(k) for k in old]
        for key, value in zip(new, values):
            if key in self.batch:
                raise KeyError(f"rename: batch already has key {key!r}")
            self.batch[key] = value
        return self

    def union(self, other: DataProto) -> DataProto:
        """Merge other's keys into self in place; a key present in both must hold equal values."""
        if len(self) and len(other) and len(other) != len(self):
            raise ValueError(f"union: {len(self)} rows vs {len(other)} rows")
        parts = (
            ("batch", self.batch, other.batch),
            ("non_tensor_batch", self.non_tensor_batch, other.non_tensor_batch),
            ("meta_info", self.meta_info, other.meta_info),
        )
        for part, mine, theirs in parts:
            for key, value in theirs.items():
                if key in mine and not _values_equal(mine[key], value):
                    raise ValueError(f"union: {part}[{key!r}] differs between the two DataProtos")
                mine[key] = value
        self.check_consistency()
        return self

    # ---- repetition and splitting -------------------------------------------------------------
    def repeat(self, repeat_times: int = 2, interleave: bool = True) -> DataProto:
        """Each row repeated: interleave gives r0 r0 r1 r1, otherwise r0 r1 r0 r1."""
        if interleave:
            batch = {k: v.repeat_interleave(repeat_times, dim=0) for k, v in self.batch.items()}
            non_tensor = {k: np.repeat(v, repeat_times, axis=0) for k, v in self.non_tensor_batch.items()}
        else:
            batch = {k: torch.cat([v] * repeat_times, dim=0) for k, v in self.batch.items()}
            non_tensor = {k: np.concatenate([v] * repeat_times, axis=0) for k, v in self.non_tensor_batch.items()}
        return DataProto(TensorBatch(batch), non_tensor, dict(self.meta_info))

    def chunk(self, chunks: int) -> list[DataProto]:
        """`chunks` equal parts (len must divide; pad first with `pad_dataproto_to_divisor`)."""
        if chunks <= 0 or len(self) % chunks:
            raise ValueError(
                f"chunk: {len(self)} rows do not split into {chunks} equal chunks; "
                "use pad_dataproto_to_divisor first"
            )
        size = len(self) // chunks
        return [self.slice(i * size, (i + 1) * size) for i in range(chunks)]

    def split(self, split_size: int) -> list[DataProto]:
        """Consecutive parts of `split_size` rows (the last may be shorter)."""
        if split_size <= 0:
            raise ValueError(f"split: split_size must be > 0, got {split_size}")
        return [self.slice(i, i + split_size) for i in range(0, len(self), split_size)]

    @staticmethod
    def concat(data: Sequence[DataProto]) -> DataProto:
        """Rows of all parts in order; meta_info from the first part, except metrics, gathered from all.

        `meta_info["metrics"]` of every part (dict of scalar or list) becomes one dict of lists.
        """
        if not data:
            raise ValueError("concat: empty list")
        keys, np_keys = set(data[0].batch), set(data[0].non_tensor_batch)
        for i, d in enumerate(data):
            if set(d.batch) != keys or set(d.non_tensor_batch) != np_keys:
                raise KeyError(
                    f"concat: part {i} has keys {sorted(d.batch)}+{sorted(d.non_tensor_batch)}, "
                    f"part 0 has {sorted(keys)}+{sorted(np_keys)}"
                )
        batch = {k: torch.cat([d.batch[k] for d in data], dim=0) for k in data[0].batch}
        non_tensor = {k: np.concatenate([d.non_tensor_batch[k] for d in data]) for k in data[0].non_tensor_batch}
        meta: dict = {}
        metrics: dict[str, list] = {}
        for d in data:
            for key, value in d.meta_info.items():
                if key != META_METRICS:
                    meta.setdefault(key, value)
                    continue
                for name, v in value.items():
                    metrics.setdefault(name, []).extend(v if isinstance(v, list) else [v])
        if any(META_METRICS in d.meta_info for d in data):
            meta[META_METRICS] = metrics
        return DataProto(TensorBatch(batch), non_tensor, meta)

    def make_iterator(
        self, mini_batch_size: int, epochs: int, seed: int | None = None, dataloader_kwargs: dict | None = None
    ) -> Iterator[DataProto]:
        """Mini-batches for `epochs` passes; order depends only on `seed` (same on every rank).

        Rows are shuffled only with dataloader_kwargs={"shuffle": True}; the permutation is drawn
        from one torch.Generator seeded with `seed` (0 when None), a fresh one per epoch.
        """
        kwargs = dict(dataloader_kwargs or {})
        shuffle = bool(kwargs.pop("shuffle", False))
        if kwargs:
            raise ValueError(f"make_iterator: not supported yet: dataloader_kwargs {sorted(kwargs)}")
        if mini_batch_size <= 0 or len(self) % mini_batch_size:
            raise ValueError(f"make_iterator: {len(self)} rows are not divisible by mini_batch_size {mini_batch_size}")
        generator = torch.Generator().manual_seed(0 if seed is None else seed)

        def iterate() -> Iterator[DataProto]:
            for _ in range(epochs):
                order = torch.randperm(len(self), generator=generator) if shuffle else torch.arange(len(self))
                for start in range(0, len(self), mini_batch_size):
                    yield self.select_idxs(order[start : start + mini_batch_size])

        return iterate()

    # ---- devices, size, pickling --------------------------------------------------------------
    def to(self, device: str | torch.device) -> DataProto:
        """Move every tensor to `device` in place; returns self."""
        for key, value in self.batch.items():
            self.batch[key] = value.to(device)
        return self

    def nbytes(self) -> tuple[int, int]:
        """(bytes of tensors, bytes of numpy arrays; object arrays count pointer size only)."""
        tensor_bytes = sum(v.numel() * v.element_size() for v in self.batch.values())
        return tensor_bytes, sum(v.nbytes for v in self.non_tensor_batch.values())

    def print_size(self, prefix: str = "") -> None:
        tensor_bytes, np_bytes = self.nbytes()
        print(f"{prefix}DataProto: tensors {tensor_bytes / 2**20:.3f} MiB, non-tensors {np_bytes / 2**20:.3f} MiB")

    def __repr__(self) -> str:
        tensors = ", ".join(f"{k}: {tuple(v.shape)} {v.dtype}" for k, v in self.batch.items())
        arrays = ", ".join(f"{k}: {v.shape} {v.dtype}" for k, v in self.non_tensor_batch.items())
        return (
            f"DataProto(len={len(self)}, batch={{{tensors}}}, non_tensor_batch={{{arrays}}}, "
            f"meta_info_keys={sorted(self.meta_info)})"
        )

    def __getstate__(self) -> dict:
        # CPU tensors as numpy arrays (`_WireTensor`); others compacted: slices and chunks are views of a larger
        # storage, which torch would pickle whole.
        return {
            "batch": {k: _to_wire(v) for k, v in self.batch.items()},
            "non_tensor_batch": self.non_tensor_batch,
            "meta_info": self.meta_info,
        }

    def __setstate__(self, state: dict) -> None:
        self.batch = TensorBatch({k: _from_wire(v) for k, v in state["batch"].items()})
        self.non_tensor_batch = state["non_tensor_batch"]
        self.meta_info = state["meta_info"]

    def save_to_disk(self, path: str) -> None:
        with open(path, "wb") as f:
            pickle.dump(self, f)

    @staticmethod
    def load_from_disk(path: str) -> DataProto:
        with open(path, "rb") as f:
            return pickle.load(f)


def pad_dataproto_to_divisor(data: DataProto, size_divisor: int) -> tuple[DataProto, int]:
    """Append copies of the first rows (cyclically) so len is a multiple of size_divisor.

    Returns:
        (padded DataProto, pad_size) where pad_size = number of appended rows.
    """
    if size_divisor <= 0:
        raise ValueError(f"size_divisor must be > 0, got {size_divisor}")
    pad_size = -len(data) % size_divisor
    if pad_size == 0 or len(data) == 0:
        return data, 0
    padding = data.select_idxs(torch.arange(pad_size) % len(data))
    return DataProto.concat([data, padding]), pad_size


def unpad_dataproto(data: DataProto, pad_size: int) -> DataProto:
    """Drop the last `pad_size` rows added by `pad_dataproto_to_divisor`."""
    return data.slice(0, len(data) - pad_size) if pad_size else data


@dataclass
class DataProtoFuture:
    """The pending result of a non-blocking worker-group call.

    `futures` are Ray object refs; `get()` fetches them (through `fetch_fn`, which adds time-outs and
    error reports, or plain `ray.get`), applies `collect_fn`, then `dispatch_fn` if set. It can be
    passed straight to another group's method: the receiving workers call `get()` themselves.
    """

    collect_fn: Callable[[list], Any]
    futures: list
    dispatch_fn: Callable[[Any], Any] | None = None
    fetch_fn: Callable[[list], list] | None = None

    def get(self) -> Any:
        if self.fetch_fn is not None:
            outputs = self.fetch_fn(self.futures)
        else:
            import ray  # only here: DataProto itself must not need Ray

            outputs = ray.get(self.futures)
        result = self.collect_fn(outputs)
        return self.dispatch_fn(result) if self.dispatch_fn is not None else result
