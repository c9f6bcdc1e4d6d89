"""verl's device helpers (`get_device_name`, `get_torch_device`, ...) for custom workers and recipes.

rlpost runs on CUDA GPUs or on CPU (gloo); Ascend NPUs are not supported, so `is_npu_available` is
always False.
"""

from __future__ import annotations

import types

import torch

__all__ = ["get_device_id", "get_device_name", "get_nccl_backend", "get_torch_device",
           "get_visible_devices_keyword", "is_cuda_available", "is_npu_available"]

is_cuda_available: bool = torch.cuda.is_available()
is_npu_available: bool = False


def get_device_name() -> str:
    """`cuda` when a CUDA device is visible, else `cpu`."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def get_torch_device() -> types.ModuleType:
    """The torch namespace of the current device: `torch.cuda` or `torch.cpu`."""
    return getattr(torch, get_device_name())


def get_device_id() -> int | str:
    """Index of the current CUDA device; `cpu` on CPU."""
    return get_torch_device().current_device()


def get_nccl_backend() -> str:
    """The collective backend for the current device: `nccl` on CUDA, `gloo` on CPU."""
    return "nccl" if get_device_name() == "cuda" else "gloo"


def get_visible_devices_keyword() -> str:
    """The environment variable that selects visible devices."""
    return "CUDA_VISIBLE_DEVICES"
