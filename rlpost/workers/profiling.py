"""`start_profile` / `stop_profile` of every role worker: the trainer's hooks into `rlpost.utils.profiler`."""

from __future__ import annotations

from rlpost.single_controller.base import Dispatch, Worker, register
from rlpost.utils.profiler import SESSION, ProfileOptions


class ProfiledWorker(Worker):
    """A worker whose process can profile the steps the trainer picks (see `rlpost.utils.profiler`)."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def start_profile(self, step: int, options: ProfileOptions) -> None:
        """Begin profiling step `step` for `options.role` (ranks outside `options.ranks` do nothing)."""
        SESSION.start(step, options, self.rank)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def stop_profile(self, role: str) -> list[str]:
        """End `role`'s part of the step; returns the files this process wrote since the last call."""
        SESSION.stop(role)
        written, SESSION.written = SESSION.written, []
        return written
