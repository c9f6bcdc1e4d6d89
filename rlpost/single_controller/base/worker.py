"""`Worker`: base class of every role class (actor, rollout, ref, critic, reward model)."""

from __future__ import annotations

import os
from typing import Any

from rlpost.single_controller.base.decorator import Dispatch, register

# Environment a worker group sets in each worker process before the role classes are built.
ENV_RANK, ENV_WORLD_SIZE, ENV_LOCAL_RANK = "RANK", "WORLD_SIZE", "LOCAL_RANK"
ENV_LOCAL_WORLD_SIZE, ENV_DEVICE = "LOCAL_WORLD_SIZE", "RLPOST_DEVICE"


class Worker:
    """Reads its place in the group from the environment (RANK, WORLD_SIZE, LOCAL_RANK, RLPOST_DEVICE).

    Outside a worker group (plain instance in a test) it is rank 0 of 1 on cpu. A subclass whose ranks
    share data shards (e.g. tensor-parallel peers) calls `set_dispatch_info` once it knows its layout,
    typically in `init_model`; the group re-reads the layout after every blocking non-data-parallel call.
    """

    def __init__(self) -> None:
        self._rank = int(os.environ.get(ENV_RANK, "0"))
        self._world_size = int(os.environ.get(ENV_WORLD_SIZE, "1"))
        self._local_rank = int(os.environ.get(ENV_LOCAL_RANK, "0"))
        self._device = os.environ.get(ENV_DEVICE, "cpu")
        self._dispatch_info = (self._rank, self._world_size, True)

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._world_size

    @property
    def local_rank(self) -> int:
        return self._local_rank

    @property
    def device(self) -> str:
        """'cpu' or 'cuda'."""
        return self._device

    def set_dispatch_info(self, dp_rank: int, dp_size: int, is_collect: bool = True) -> None:
        """Declare this rank's data-parallel rank/size and whether its results are returned."""
        if not 0 <= dp_rank < dp_size:
            raise ValueError(f"dp_rank {dp_rank} is outside [0, {dp_size})")
        self._dispatch_info = (dp_rank, dp_size, is_collect)

    def get_dispatch_info(self) -> tuple[int, int, bool]:
        """(dp_rank, dp_size, is_collect) of this rank."""
        return self._dispatch_info

    # ---- named meshes (verl's dispatch-collect registration, read by make_nd_compute_dataproto_dispatch_fn) ----
    def _meshes(self) -> tuple[dict[str, int], dict[str, bool]]:
        # created on first use, so a subclass that skips Worker.__init__ still has them
        return self.__dict__.setdefault("_mesh_dp_rank", {}), self.__dict__.setdefault("_mesh_collect", {})

    def _register_dispatch_collect_info(self, mesh_name: str, dp_rank: int, is_collect: bool) -> None:
        """Declare this rank's data-parallel rank in mesh `mesh_name` and whether its results are returned."""
        dispatch, collect = self._meshes()
        if mesh_name in dispatch:
            raise ValueError(f"mesh {mesh_name!r} is already registered on rank {self.rank}")
        dispatch[mesh_name], collect[mesh_name] = int(dp_rank), bool(is_collect)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def _query_dispatch_info(self, mesh_name: str) -> int:
        """This rank's dp rank in mesh `mesh_name`."""
        dispatch, _ = self._meshes()
        if mesh_name not in dispatch:
            raise KeyError(f"mesh {mesh_name!r} is not registered on rank {self.rank} of {type(self).__name__} "
                           f"(registered: {sorted(dispatch)}); call _register_dispatch_collect_info first")
        return dispatch[mesh_name]

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def _query_collect_info(self, mesh_name: str) -> bool:
        return self.query_collect_info(mesh_name)

    def query_collect_info(self, mesh_name: str) -> bool:
        """Whether this rank's results are returned for mesh `mesh_name`."""
        self._query_dispatch_info(mesh_name)  # the same error for a mesh never registered
        return self._meshes()[1][mesh_name]

    def get_dispatch_collect(self) -> dict[str, dict[str, Any]]:
        """{"dispatch_dp_rank": {mesh: dp rank}, "collect_dp_rank": {mesh: is_collect}} of this rank."""
        dispatch, collect = self._meshes()
        return {"dispatch_dp_rank": dict(dispatch), "collect_dp_rank": dict(collect)}

    def set_dispatch_collect(self, mesh_name: str, dispatch_dp_rank: dict[str, int],
                             collect_dp_rank: dict[str, bool]) -> None:
        """Register `mesh_name` with the layout of another role's one mesh (both dicts hold one entry, as
        `get_dispatch_collect` of a role with one mesh gives): colocated roles sharing a layout."""
        if len(dispatch_dp_rank) != 1 or len(collect_dp_rank) != 1:
            raise ValueError(f"set_dispatch_collect({mesh_name!r}): expected one mesh in each dict, got "
                             f"{sorted(dispatch_dp_rank)} and {sorted(collect_dp_rank)}")
        self._register_dispatch_collect_info(mesh_name, next(iter(dispatch_dp_rank.values())),
                                             next(iter(collect_dp_rank.values())))
