"""The Ray actor behind every worker: one process per bundle, holding one instance per role.

Colocated roles (actor + rollout + ref, critic) are several instances in the same host, so they
share the process, its device and its torch.distributed group.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from rlpost.utils.distributed import free_port
from rlpost.protocol import DataProto, DataProtoFuture
from rlpost.single_controller.base.decorator import FutureShard, trim_output
from rlpost.single_controller.ray.diagnostics import WorkerInfo, setup_worker_process


class WorkerHost:
    """Holds the role instances of one rank; `call` runs one role's method on it."""

    def __init__(self) -> None:
        self._roles: dict[str, Any] = {}

    def node_ip_and_free_port(self) -> tuple[str, int]:
        """This node's IP and a TCP port free right now (rank 0 becomes MASTER_ADDR:MASTER_PORT)."""
        import ray

        return ray.util.get_node_ip_address(), free_port("")

    def ping(self) -> int:
        """This process's pid: a live rank answers once its current call ends, a dead one's ping fails."""
        return os.getpid()

    def setup(self, env: dict[str, str], label: str = "") -> WorkerInfo:
        """Set the rank's environment and its logs (see `diagnostics`; `label`, the group's roles, starts the
        file names); called before any role is built, so a hang while building one can be looked into.

        Returns:
            Where this process runs and where it dumps its stacks, for the driver's stall reports.
        """
        os.environ.update(env)
        return setup_worker_process(int(env["RANK"]), label)

    def build_roles(self, specs: dict[str, tuple[type, tuple, dict]]) -> int:
        """Build every role (`{prefix: (class, args, kwargs)}`); returns this process's pid."""
        for prefix, (cls, args, kwargs) in specs.items():
            self._roles[prefix] = cls(*args, **kwargs)
        return os.getpid()

    def dispatch_info(self, prefix: str) -> tuple[int, int, bool]:
        role = self._roles[prefix]
        getter = getattr(role, "get_dispatch_info", None)
        if getter is None:
            rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
            return rank, world, True
        return getter()

    def call(self, prefix: str, method: str, args: tuple, kwargs: dict, trim: int) -> Any:
        """Resolve futures among the arguments, run the method, drop rows computed for padding.

        `trim` is the padding at the end of this rank's DataProto shard when the driver split a
        DataProto; when it split a DataProtoFuture, the shard (and its padding) is computed here.
        """
        args = tuple(self._resolve(a) for a in args)
        kwargs = {k: self._resolve(v) for k, v in kwargs.items()}
        values = list(args) + list(kwargs.values())
        shards = [v for v in values if isinstance(v, _ResolvedShard)]
        if shards:
            trim = shards[0].trim
        args = tuple(_unwrap(a) for a in args)
        kwargs = {k: _unwrap(v) for k, v in kwargs.items()}
        rows_in = next((len(v) for v in list(args) + list(kwargs.values()) if isinstance(v, DataProto)), 0)
        output = getattr(self._roles[prefix], method)(*args, **kwargs)
        return trim_output(output, trim, rows_in)

    @staticmethod
    def _resolve(value: Any) -> Any:
        if isinstance(value, FutureShard):
            return _ResolvedShard(*value.resolve())
        if isinstance(value, DataProtoFuture):
            return value.get()
        return value


@dataclass
class _ResolvedShard:
    data: DataProto
    trim: int


def _unwrap(value: Any) -> Any:
    return value.data if isinstance(value, _ResolvedShard) else value
