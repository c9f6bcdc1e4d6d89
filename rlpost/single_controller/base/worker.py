"""`Worker`: base class of every role class (actor, rollout, ref, critic, reward model)."""

from __future__ import annotations

import os

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
