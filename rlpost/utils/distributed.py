"""Process-group start-up inside a worker, from the env set by the worker group (or torchrun)."""

from __future__ import annotations

import datetime
import os

import torch
import torch.distributed as dist


def init_distributed(device: str | None = None, timeout_s: float = 1800.0) -> None:
    """Initialise the default process group once per process (later calls do nothing).

    Reads RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT. On cpu the backend is gloo; on cuda
    it is nccl for CUDA tensors plus gloo for CPU tensors, and the current device is LOCAL_RANK.

    Args:
        device: 'cpu' or 'cuda'; None reads RLPOST_DEVICE (default 'cpu').
        timeout_s: collective and rendezvous time-out.
    """
    if dist.is_initialized():
        return
    device = device or os.environ.get("RLPOST_DEVICE", "cpu")
    if device not in ("cpu", "cuda"):
        raise ValueError(f"init_distributed: device must be 'cpu' or 'cuda', got {device!r}")
    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        if key not in os.environ:
            raise RuntimeError(f"init_distributed: environment variable {key} is not set")
    if device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        backend = "cpu:gloo,cuda:nccl"
    else:
        backend = "gloo"
    dist.init_process_group(
        backend=backend,
        init_method="env://",
        rank=int(os.environ["RANK"]),
        world_size=int(os.environ["WORLD_SIZE"]),
        timeout=datetime.timedelta(seconds=timeout_s),
    )


def consecutive_groups(size: int, backend: str | None = "gloo") -> tuple[dist.ProcessGroup | None, int]:
    """Split the default group into blocks of `size` consecutive ranks (e.g. tensor-parallel peers).

    `backend` None gives the groups the default group's backends.

    Every rank must call this with the same `size` (creating a group is collective over all ranks).
    Returns (this rank's group, its index inside the block); (None, 0) when `size` is 1.
    """
    if size == 1:
        return None, 0
    world, rank = dist.get_world_size(), dist.get_rank()
    if world % size:
        raise ValueError(f"group size {size} must divide the world size {world}")
    mine = None
    for start in range(0, world, size):
        group = dist.new_group(list(range(start, start + size)), backend=backend)
        if start <= rank < start + size:
            mine = group
    return mine, rank % size


def gather_in_group(item: object, group: dist.ProcessGroup | None) -> list[object]:
    """Every member's `item` in rank order (any picklable object); [item] without a group."""
    if group is None:
        return [item]
    out: list[object] = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, item, group=group)
    return out


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on `host` right now (for MASTER_PORT); "" binds every interface."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]
