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
from rlpost.protocol_utils import (  # noqa: F401  (verl's names, importable from here)
    AUTO_PADDING_KEY,
    DataProtoConfig,
    _WireTensor,
    deserialize_single_tensor,
    deserialize_tensordict,
    fold_batch_dim,
    from_wire,
    list_of_dict_to_dict_of_list,
    serialize_single_tensor,
    serialize_tensordict,
    to_wire,
    unfold_batch_dim,
    union_numpy_dict,
    union_tensor_dict,
)

IndexLike = Sequence[int] | np.ndarray | torch.Tensor


class TensorBatch(dict):
    """A `dict[str, Tensor]` whose tensors share dim 0; `batch_size` mirrors tensordict's attribute.

    It remembers its row count once its last key is removed (as a TensorDict keeps its batch size), so a
    DataProto whose tensors were all popped still knows how many rows it has.
    """

    def __init__(self, data: Any = (), batch_dims: int = 1, rows: int = 0) -> None:
        super().__init__(data)
        self.batch_dims = batch_dims
        self.rows = rows
        for value in self.values():
            self.rows = int(value.shape[0])
            break

    def __setitem__(self, key: str, value: torch.Tensor) -> None:
        super().__setitem__(key, value)
        self.rows = int(value.shape[0])

    @property
    def batch_size(self) -> torch.Size:
        """The first `batch_dims` dims of the tensors (torch.Size([B]) by default); torch.Size([rows]) when empty."""
        for value in self.values():
            return torch.Size(value.shape[: self.batch_dims])
        return torch.Size([self.rows])


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
        if not self.batch and self.non_tensor_batch:
            self.batch.rows = len(next(iter(self.non_tensor_batch.values())))
        self.check_consistency()

    # ---- construction -------------------------------------------------------------------------
    @classmethod
    def from_dict(
        cls,
        tensors: dict[str, torch.Tensor] | None = None,
        non_tensors: dict[str, np.ndarray | list] | None = None,
        meta_info: dict | None = None,
        num_batch_dims: int = 1,
        auto_padding: bool = False,
    ) -> DataProto:
        """Build from tensors (B, ...) and numpy arrays / lists of length B.

        num_batch_dims: how many leading dims every tensor shares as its batch size (> 1 only without
        non-tensors). auto_padding: let `chunk` split this DataProto unevenly (see `DataProtoConfig`).
        """
        if num_batch_dims < 1:
            raise ValueError(f"DataProto.from_dict: num_batch_dims must be >= 1, got {num_batch_dims}")
        if num_batch_dims > 1 and non_tensors:
            raise ValueError("DataProto.from_dict: num_batch_dims > 1 needs non_tensors to be empty")
        tensors = dict(tensors or {})
        shapes = {k: tuple(v.shape[:num_batch_dims]) for k, v in tensors.items()}
        if num_batch_dims > 1 and len(set(shapes.values())) > 1:  # dim 0 alone: check_consistency names the key
            raise ValueError(f"DataProto.from_dict: the tensors' first {num_batch_dims} dim(s) differ: {shapes}")
        meta_info = dict(meta_info or {})
        if auto_padding:
            meta_info[AUTO_PADDING_KEY] = True
        return cls(TensorBatch(tensors, batch_dims=num_batch_dims), dict(non_tensors or {}), meta_info)

    @classmethod
    def from_single_dict(cls, data: dict[str, Any], meta_info: dict | None = None,
                         auto_padding: bool = False) -> DataProto:
        """Build from one dict: tensors go to `batch`, numpy arrays and lists to `non_tensor_batch`."""
        tensors, non_tensors = {}, {}
        for key, value in data.items():
            if isinstance(value, torch.Tensor):
                tensors[key] = value
            elif isinstance(value, (np.ndarray, list, tuple)):
                non_tensors[key] = value
            else:
                raise TypeError(f"DataProto.from_single_dict: key {key!r} has unsupported type {type(value)}")
        return cls.from_dict(tensors, non_tensors, meta_info, auto_padding=auto_padding)

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
        return self.batch.rows

    # ---- row selection ------------------------------------------------------------------------
    def _take(self, index: Any) -> DataProto:
        """Rows `index` (slice or 1-D int index) of every field; meta_info is copied shallowly."""
        batch = {k: v[index] for k, v in self.batch.items()}
        np_index = index.cpu().numpy() if isinstance(index, torch.Tensor) else index
        non_tensor = {k: v[np_index] for k, v in self.non_tensor_batch.items()}
        rows = len(range(len(self))[index]) if isinstance(index, slice) else len(np_index)
        return DataProto(TensorBatch(batch, batch_dims=self.batch.batch_dims, rows=rows), non_tensor,
                         dict(self.meta_info))

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
        return DataProto(TensorBatch(batch, rows=len(self) * repeat_times), non_tensor, dict(self.meta_info))

    def sample_level_repeat(self, repeat_times: Sequence[int] | np.ndarray | torch.Tensor) -> DataProto:
        """Row i repeated repeat_times[i] times, in row order (r0 r0 r1 r2 r2 r2 for [2, 1, 3])."""
        counts = torch.as_tensor(np.asarray(repeat_times) if not isinstance(repeat_times, torch.Tensor)
                                 else repeat_times).long()
        if counts.ndim != 1 or counts.numel() != len(self) or bool((counts < 0).any()):
            raise ValueError(f"sample_level_repeat: need {len(self)} counts >= 0 (one per row), got {repeat_times!r}")
        batch = {k: v.repeat_interleave(counts.to(v.device), dim=0) for k, v in self.batch.items()}
        non_tensor = {k: np.repeat(v, counts.numpy(), axis=0) for k, v in self.non_tensor_batch.items()}
        return DataProto(TensorBatch(batch, rows=int(counts.sum())), non_tensor, dict(self.meta_info))

    def unfold_column_chunks(self, n_split: int, split_keys: Sequence[str] | None = None) -> DataProto:
        """Each row becomes `n_split` rows: keys in `split_keys` have their dim 1 cut into n_split equal
        column chunks (chunk j of row i lands in row i * n_split + j); every other key is repeated."""
        split = set(split_keys or [])

        def unfold(v: Any) -> Any:
            if v.shape[1] % n_split:
                raise ValueError(f"unfold_column_chunks: dim 1 of size {v.shape[1]} does not split into {n_split}")
            return v.reshape(v.shape[0] * n_split, v.shape[1] // n_split, *v.shape[2:])

        batch = {k: unfold(v) if k in split else v.repeat_interleave(n_split, dim=0)
                 for k, v in self.batch.items()}
        non_tensor = {k: unfold(v) if k in split else np.repeat(v, n_split, axis=0)
                      for k, v in self.non_tensor_batch.items()}
        return DataProto(TensorBatch(batch, rows=len(self) * n_split), non_tensor, dict(self.meta_info))

    def is_padding_enabled(self) -> bool:
        """True when this DataProto (from_dict(auto_padding=True)) or `DataProtoConfig.auto_padding` allows
        uneven chunks."""
        return bool(self.meta_info.get(AUTO_PADDING_KEY, False)) or DataProtoConfig.auto_padding

    def padding(self, padding_size: int, padding_candidate: str = "") -> None:
        """Append `padding_size` copies of the first row ("first") or the last row (anything else), in place."""
        if padding_size == 0:
            return
        row = self.select_idxs([0 if padding_candidate == "first" else len(self) - 1])
        padded = DataProto.concat([self, row.repeat(padding_size)])
        self.batch, self.non_tensor_batch = padded.batch, padded.non_tensor_batch

    def chunk(self, chunks: int) -> list[DataProto]:
        """`chunks` equal parts (len must divide; pad first with `pad_dataproto_to_divisor`).

        With padding enabled (`is_padding_enabled`), parts of ceil(len / chunks) rows as `torch.chunk` cuts
        them, the last shorter; it must still give `chunks` parts.
        """
        if chunks > 0 and len(self) % chunks and self.is_padding_enabled():
            size = -(-len(self) // chunks)
            parts = [self.slice(i, i + size) for i in range(0, len(self), size)]
            if len(parts) != chunks:
                raise ValueError(f"chunk: {len(self)} rows in parts of {size} give {len(parts)} parts, not {chunks}")
            return parts
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
        """Rows of all parts in order; meta_info merged: a key in several parts must hold one value there,
        except `meta_info["metrics"]`, gathered from all.

        Each part's metrics (a dict of scalar or list, or a list of such dicts, one per worker) become one dict
        of lists; a list value is extended, not nested.
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
        meta = _merge_meta([d.meta_info for d in data])
        return DataProto(TensorBatch(batch, rows=sum(len(d) for d in data)), non_tensor, meta)

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

    def to_tensordict(self) -> Any:
        """A `tensordict.TensorDict` of the rows: tensors as they are, non-tensors as a NonTensorStack per key,
        meta_info entries as NonTensorData (verl's layout). Needs the `tensordict` package."""
        try:
            from tensordict import NonTensorData, NonTensorStack, TensorDict
        except ImportError as err:
            raise ImportError("DataProto.to_tensordict needs the tensordict package (pip install tensordict); "
                              "rlpost itself keeps tensors in a plain dict (DataProto.batch)") from err
        common = set(self.batch) & set(self.non_tensor_batch)
        if common:
            raise ValueError(f"to_tensordict: keys {sorted(common)} are in both batch and non_tensor_batch")
        source: dict[str, Any] = dict(self.batch)
        for key, value in self.non_tensor_batch.items():
            source[key] = NonTensorStack.from_list([NonTensorData(item) for item in value])
        out = TensorDict(source, batch_size=[len(self)])
        for key, value in self.meta_info.items():
            out[key] = NonTensorData(value)
        return out

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
            "batch": {k: to_wire(v) for k, v in self.batch.items()},
            "non_tensor_batch": self.non_tensor_batch,
            "meta_info": self.meta_info,
            "rows": len(self),
            "batch_dims": self.batch.batch_dims,
        }

    def __setstate__(self, state: dict) -> None:
        self.batch = TensorBatch({k: from_wire(v) for k, v in state["batch"].items()},
                                 batch_dims=state.get("batch_dims", 1), rows=state.get("rows", 0))
        self.non_tensor_batch = state["non_tensor_batch"]
        self.meta_info = state["meta_info"]

    def save_to_disk(self, path: str) -> None:
        with open(path, "wb") as f:
            pickle.dump(self, f)

    @staticmethod
    def load_from_disk(path: str) -> DataProto:
        with open(path, "rb") as f:
            return pickle.load(f)


def _merge_meta(metas: list[dict]) -> dict:
    """The meta_info of concatenated parts (see `DataProto.concat`)."""
    meta: dict = {}
    metrics: dict[str, list] = {}
    for i, info in enumerate(metas):
        for key, value in info.items():
            if key != META_METRICS:
                if key in meta and not _values_equal(meta[key], value):
                    raise ValueError(f"concat: meta_info[{key!r}] is {meta[key]!r} in an earlier part but "
                                     f"{value!r} in part {i}; parts must agree on every meta_info key but metrics")
                meta.setdefault(key, value)
                continue
            for per_worker in value if isinstance(value, list) else [value] if value is not None else []:
                for name, v in per_worker.items():
                    metrics.setdefault(name, []).extend(v if isinstance(v, list) else [v])
    if any(META_METRICS in info for info in metas):
        meta[META_METRICS] = metrics
    return meta


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
