"""Weight transfer from the trainer ranks to rollout ranks on other devices (split placement).

The trainer's rank 0 and every rollout rank form one process group of their own (gloo on CPU, NCCL on GPU),
rendezvoused through a TCP store that trainer rank 0 hosts. It is separate from each pool's default group:
the two pools never share one. After each update, trainer rank 0 packs the full parameters (gathered by every
trainer rank, one at a time) into flat buckets of `update_weights_bucket_megabytes` and broadcasts each; the
rollout ranks unpack the same bucket plan, computed from the parameter names and shapes sent once at
connection, and stream the tensors into their engine. Nothing goes through disk or the Ray object store.

Test hook: with RLPOST_TEST_DIE_IN_RECEIVE=N in a rollout worker's environment, it kills itself as its N-th
transfer starts (tests/trainer/ppo/test_split_e2e.py); unset in users' runs.
"""

from __future__ import annotations

import datetime
import os
import signal
from dataclasses import dataclass
from typing import Iterable, Iterator

import torch
import torch.distributed as dist

SOURCE = 0  # trainer rank 0 is rank 0 of the transfer group
# Tests: "N" kills the receiving process (SIGKILL) as its N-th transfer starts (1: the one at start-up).
DIE_IN_RECEIVE_ENV = "RLPOST_TEST_DIE_IN_RECEIVE"
_received = 0  # transfers this process has started receiving


@dataclass(frozen=True)
class TensorMeta:
    """Name (HF), shape and dtype of one parameter as the engine receives it."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        return int(torch.Size(self.shape).numel()) * torch.empty((), dtype=self.dtype).element_size()


def plan_buckets(metas: list[TensorMeta], bucket_bytes: int) -> list[list[TensorMeta]]:
    """Consecutive parameters grouped into buckets of one dtype and at most `bucket_bytes` each (a larger
    tensor gets a bucket of its own). Sender and receivers compute the same plan from the same list."""
    buckets: list[list[TensorMeta]] = []
    size = 0
    for meta in metas:
        current = buckets[-1] if buckets else None
        if current is None or current[0].dtype != meta.dtype or size + meta.nbytes > bucket_bytes:
            buckets.append([meta])
            size = meta.nbytes
        else:
            current.append(meta)
            size += meta.nbytes
    return buckets


def connect(host: str, port: int, rank: int, world: int, device: str, timeout_s: float) -> dist.ProcessGroup:
    """Join the transfer group of `world` ranks (rank 0 hosts the store at host:port)."""
    timeout = datetime.timedelta(seconds=timeout_s)
    store = dist.TCPStore(host, port, world, rank == SOURCE, timeout=timeout)
    prefixed = dist.PrefixStore("rlpost_weight_sync", store)
    if device == "cuda":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout  # actor_rollout_ref.nccl_timeout: a dead peer ends a blocked broadcast
        return dist.ProcessGroupNCCL(prefixed, rank, world, options)
    return dist.ProcessGroupGloo(prefixed, rank, world, timeout)


def _broadcast(group: dist.ProcessGroup, flat: torch.Tensor) -> None:
    opts = dist.BroadcastOptions()
    opts.rootRank = SOURCE
    group.broadcast([flat], opts).wait()


def send(group: dist.ProcessGroup | None, named: Iterable[tuple[str, torch.Tensor]], metas: list[TensorMeta],
         bucket_bytes: int) -> int:
    """Broadcast every tensor of `named` (in `metas` order) bucket by bucket; returns the bytes sent.

    Every trainer rank calls this (each full tensor is gathered collectively); only the one holding
    `group` (trainer rank 0) sends, the others drop each tensor after the gather.
    """
    sent = 0
    it = iter(named)
    for bucket in plan_buckets(metas, bucket_bytes):
        parts = []
        for meta in bucket:
            name, tensor = next(it)
            if name != meta.name:
                raise RuntimeError(f"weight sync: expected {meta.name!r}, the model gave {name!r}")
            if group is not None:
                parts.append(tensor.reshape(-1))
        if group is not None:
            flat = torch.cat(parts) if len(parts) > 1 else parts[0].contiguous()
            _broadcast(group, flat)
            sent += flat.numel() * flat.element_size()
    return sent


def receive(group: dist.ProcessGroup, metas: list[TensorMeta], bucket_bytes: int,
            device: str) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (name, tensor) for every parameter, receiving one bucket at a time (each yielded tensor is a
    view of the bucket, valid until the next bucket arrives: engines copy what they load)."""
    global _received
    _received += 1
    if os.environ.get(DIE_IN_RECEIVE_ENV) == str(_received):
        os.kill(os.getpid(), signal.SIGKILL)  # a crash while the trainer sends, for the tests
    for bucket in plan_buckets(metas, bucket_bytes):
        flat = torch.empty(sum(m.nbytes for m in bucket) // bucket[0].dtype.itemsize, dtype=bucket[0].dtype,
                           device=device)
        _broadcast(group, flat)
        offset = 0
        for meta in bucket:
            n = int(torch.Size(meta.shape).numel())
            yield meta.name, flat[offset:offset + n].view(meta.shape)
            offset += n
