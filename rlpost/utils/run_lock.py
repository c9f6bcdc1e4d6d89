"""One run per output folder: a run holds an exclusive lock on `<trainer.default_local_dir>/.rlpost.lock` while it
trains, so a second run started on the same folder stops at start-up (naming the first) instead of writing the
same `global_step_N` checkpoints and `metrics.jsonl` rows as it.

The lock is the kernel's (`fcntl.flock`): it is released when the run ends, however it ends (a crash or SIGKILL
included), so a stale lock file never blocks the next run.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from typing import Iterator

LOCK_FILE = ".rlpost.lock"


class FolderInUse(RuntimeError):
    """Another live run holds the folder's lock."""


@contextlib.contextmanager
def run_lock(folder: str, key: str = "trainer.default_local_dir") -> Iterator[None]:
    """Hold `folder`'s run lock for the block.

    Raises:
        FolderInUse: another process holds it; the message names that run (pid, host, start time) and `key`.
    """
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, LOCK_FILE)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise FolderInUse(f"{key}={folder!r} is in use by another run ({_holder(path)}); give this run its own "
                              f"{key}, or wait for that one to finish") from None
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                 "started": time.strftime("%Y-%m-%d %H:%M:%S")}).encode())
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _holder(path: str) -> str:
    try:
        with open(path) as f:
            info = json.load(f)
        return f"pid {info['pid']} on {info['host']}, started {info['started']}"
    except (OSError, ValueError, KeyError):
        return "its details unreadable"
