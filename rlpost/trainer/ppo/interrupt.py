"""Stopping a run from outside: Ctrl-C (SIGINT) or SIGTERM (`kill`, a scheduler ending the job).

Both end the driver the same way: the step in progress is abandoned, Ray and the workers are shut down, and
one line says at which step the run stopped and which checkpoint a restart resumes from. Without this a
SIGTERM ended the process at once (Ray's handler, then an abort) with nothing from rlpost.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from typing import Iterator


class RunInterrupted(Exception):
    """The run was stopped by a signal; the message says where, and what resumes it. `exit_status` is the
    shell's for that signal (130 for SIGINT, 143 for SIGTERM)."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.exit_status = 128 + signum


class _Signalled(KeyboardInterrupt):
    """SIGTERM, raised in the main thread where Ctrl-C raises KeyboardInterrupt (Ray's waits let both through)."""

    signum = signal.SIGTERM


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM raises in the main thread, as Ctrl-C does, while the block runs (elsewhere: no change)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _raise(signum, frame):
        raise _Signalled()

    previous = signal.signal(signal.SIGTERM, _raise)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def interrupted(err: KeyboardInterrupt, root: str, step: int, total: int) -> RunInterrupted:
    """The `RunInterrupted` for a signal met during step `step` of `total`, checkpoints under `root`."""
    from rlpost.checkpoint.manager import CheckpointManager

    signum = getattr(err, "signum", signal.SIGINT)
    name = signal.Signals(signum).name
    latest = CheckpointManager(os.path.expanduser(root)).find_latest_complete()
    where = f"during step {step} of {total}" if step else "before the first step"
    resume = (f"the newest checkpoint, {latest[1]} (step {latest[0]}), is complete: run the same command again "
              "to resume from it (trainer.resume_mode=auto)" if latest else
              "no checkpoint was saved yet: a restart begins at step 1 (trainer.save_freq sets how often one is)")
    return RunInterrupted(f"stopped by {name} {where}; {resume}", signum)
