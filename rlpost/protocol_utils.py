"""Helpers around `rlpost.protocol.DataProto`, importable from `rlpost.protocol` under verl's names.

Dict unions with equality checks, folding extra batch dims, a flat (dtype, shape, bytes) encoding of tensors,
verl's global auto-padding switch, and the numpy-array wire format `DataProto` pickles its tensors with.
No Ray, vLLM or torch.distributed imports here.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

AUTO_PADDING_KEY = "_rlpost_auto_padding"


class _DataProtoConfigMeta(type):
    _config: dict = {}

    @property
    def auto_padding(cls) -> bool:
        env = (os.getenv("RLPOST_AUTO_PADDING") or os.getenv("VERL_AUTO_PADDING") or "FALSE").upper()
        return env in ("TRUE", "1") or bool(cls._config.get(AUTO_PADDING_KEY, False))

    @auto_padding.setter
    def auto_padding(cls, enabled: bool) -> None:
        if not isinstance(enabled, bool):
            raise TypeError(f"DataProtoConfig.auto_padding takes True or False, got {enabled!r}")
        cls._config[AUTO_PADDING_KEY] = enabled


class DataProtoConfig(metaclass=_DataProtoConfigMeta):
    """Process-wide `DataProto` switches: `DataProtoConfig.auto_padding = True` lets `chunk` split unevenly
    (also set by the environment variable RLPOST_AUTO_PADDING=1, or verl's VERL_AUTO_PADDING=1)."""

    auto_padding_key = AUTO_PADDING_KEY


def _deep_equal(a: Any, b: Any) -> bool:
    """Equality that holds for NaN == NaN and compares numpy arrays (object arrays element by element)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, np.ndarray):
        if a.dtype != b.dtype or a.shape != b.shape:
            return False
        if a.dtype != object:
            return bool(np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"))
        return all(_deep_equal(x, y) for x, y in zip(a.flat, b.flat))
    if isinstance(a, torch.Tensor):
        return a.shape == b.shape and bool(torch.equal(a, b))
    return bool(a == b)


def union_tensor_dict(tensor_dict1: Any, tensor_dict2: Any) -> Any:
    """Adds tensor_dict2's keys to tensor_dict1 (in place) and returns it; shared keys must hold equal tensors.

    Raises:
        ValueError: the batch sizes differ, or a shared key holds different tensors.
    """
    if tensor_dict1.batch_size != tensor_dict2.batch_size:
        raise ValueError(f"union_tensor_dict: batch sizes {tuple(tensor_dict1.batch_size)} and "
                         f"{tuple(tensor_dict2.batch_size)} differ")
    for key, value in tensor_dict2.items():
        if key in tensor_dict1 and not _deep_equal(tensor_dict1[key], value):
            raise ValueError(f"union_tensor_dict: key {key!r} holds different tensors in the two dicts")
        tensor_dict1[key] = value
    return tensor_dict1


def union_numpy_dict(tensor_dict1: dict[str, np.ndarray], tensor_dict2: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Adds tensor_dict2's arrays to tensor_dict1 (in place) and returns it; shared keys must be equal
    (NaN equals NaN; object arrays compared element by element)."""
    for key, value in tensor_dict2.items():
        if key in tensor_dict1:
            if not (isinstance(value, np.ndarray) and isinstance(tensor_dict1[key], np.ndarray)):
                raise TypeError(f"union_numpy_dict: key {key!r} must be a numpy array in both dicts")
            if not _deep_equal(tensor_dict1[key], value):
                raise ValueError(f"union_numpy_dict: key {key!r} holds different arrays in the two dicts")
        tensor_dict1[key] = value
    return tensor_dict1


def list_of_dict_to_dict_of_list(list_of_dict: list[dict]) -> dict[str, list]:
    """[{a: 1, b: 2}, {a: 3, b: 4}] -> {a: [1, 3], b: [2, 4]}; every dict needs the first one's keys."""
    if not list_of_dict:
        return {}
    out: dict[str, list] = {key: [] for key in list_of_dict[0]}
    for i, item in enumerate(list_of_dict):
        if set(item) != set(out):
            raise KeyError(f"list_of_dict_to_dict_of_list: dict {i} has keys {sorted(item)}, dict 0 {sorted(out)}")
        for key, value in item.items():
            out[key].append(value)
    return out


def fold_batch_dim(data: Any, new_batch_size: int) -> Any:
    """Rows (B, ...) regrouped as (new_batch_size, B // new_batch_size, ...), tensors and arrays alike."""
    rows = len(data)
    if new_batch_size <= 0 or rows % new_batch_size:
        raise ValueError(f"fold_batch_dim: {rows} rows do not fold into {new_batch_size} equal groups")
    batch = {k: v.reshape(new_batch_size, -1, *v.shape[1:]) for k, v in data.batch.items()}
    non_tensor = {k: v.reshape(new_batch_size, -1, *v.shape[1:]) for k, v in data.non_tensor_batch.items()}
    return type(data).from_dict(batch, non_tensor, data.meta_info)


def unfold_batch_dim(data: Any, batch_dims: int = 2) -> Any:
    """The first `batch_dims` dims of every tensor and array flattened into one batch dim (the inverse of
    `fold_batch_dim` for batch_dims=2)."""
    def flat(v: Any) -> Any:
        return v.reshape(-1, *v.shape[batch_dims:])

    batch = {k: flat(v) for k, v in data.batch.items()}
    non_tensor = {k: flat(v) for k, v in data.non_tensor_batch.items()}
    return type(data).from_dict(batch, non_tensor, data.meta_info)


def serialize_single_tensor(obj: torch.Tensor) -> tuple[str, torch.Size, np.ndarray]:
    """(dtype name without "torch.", shape, the bytes as a flat uint8 numpy array) of a CPU tensor."""
    data = obj.detach().flatten().contiguous().view(torch.uint8).numpy()
    return str(obj.dtype).removeprefix("torch."), obj.shape, data


def deserialize_single_tensor(arr: tuple[str, Any, Any]) -> torch.Tensor:
    """The tensor of a `serialize_single_tensor` triple (a writable copy of the bytes)."""
    dtype, shape, data = arr
    torch_dtype = getattr(torch, dtype, None)
    if not isinstance(torch_dtype, torch.dtype):
        raise ValueError(f"deserialize_single_tensor: {dtype!r} is not a torch dtype")
    flat = torch.frombuffer(bytearray(data), dtype=torch.uint8) if len(data) else torch.empty(0, dtype=torch.uint8)
    return flat.view(torch_dtype).view(tuple(shape))


def serialize_tensordict(batch: Any) -> tuple[tuple[int, ...], str | None, dict[str, tuple]]:
    """(batch size, device or None, {key: triple, or (layout, [triples]) for a nested tensor})."""
    items: dict[str, tuple] = {}
    for key, value in batch.items():
        if value.is_nested:
            layout = str(value.layout).removeprefix("torch.")
            items[key] = (layout, [serialize_single_tensor(t) for t in value.unbind()])
        else:
            items[key] = serialize_single_tensor(value)
    devices = {str(v.device) for v in batch.values()}
    device = getattr(batch, "device", None) or (devices.pop() if len(devices) == 1 else None)
    return tuple(batch.batch_size), None if device is None else str(device), items


def deserialize_tensordict(arr: tuple) -> Any:
    """The `TensorBatch` of a `serialize_tensordict` result (tensors on CPU)."""
    from rlpost.protocol import TensorBatch  # the batch type lives with DataProto

    batch_size, _device, items = arr
    tensors = {}
    for key, value in items.items():
        if len(value) == 3:
            tensors[key] = deserialize_single_tensor(value)
        elif len(value) == 2:
            layout, parts = value
            tensors[key] = torch.nested.as_nested_tensor([deserialize_single_tensor(p) for p in parts],
                                                         layout=getattr(torch, layout))
        else:
            raise ValueError(f"deserialize_tensordict: key {key!r} has an encoding of {len(value)} parts, "
                             "expected 3 (a tensor) or 2 (a nested tensor)")
    return TensorBatch(tensors, batch_dims=max(len(batch_size), 1), rows=batch_size[0] if batch_size else 0)


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


def to_wire(t: torch.Tensor) -> torch.Tensor | _WireTensor:
    """What `DataProto.__getstate__` pickles for tensor `t`."""
    # torch's own pickling: device tensors, autograd leaves, lazy conj/neg views, and broadcast (stride-0) views,
    # whose storage is smaller than the tensor (numpy would send every element)
    if t.device.type != "cpu" or t.requires_grad or t.is_conj() or t.is_neg() or 0 in t.stride():
        return _compact(t)
    try:
        return _WireTensor(t.numpy(), t.dtype)
    except TypeError:  # a dtype numpy has no type for: its bits as an integer type of the same width
        bits = _BITS.get(t.element_size())
        return _WireTensor(t.view(bits).numpy(), t.dtype) if bits is not None else _compact(t)


def from_wire(value: torch.Tensor | _WireTensor) -> torch.Tensor:
    return value.tensor() if isinstance(value, _WireTensor) else value
