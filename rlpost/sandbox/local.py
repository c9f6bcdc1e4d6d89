"""The service the trainer starts for `sandbox_fusion.url=local`, watched and restarted on the same port if it
dies mid-run (clients retry meanwhile, so no step is lost), stopped with the run."""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
from typing import Iterator

logger = logging.getLogger(__name__)
START_TIMEOUT_S = 60.0


class LocalSandbox:
    """`python -m rlpost.sandbox.serve` in a child process; `url` is its `/run_code` address."""

    def __init__(self, workers: int, queue: int = 1024, seccomp: bool = True):
        self.workers, self.queue, self.seccomp = workers, queue, seccomp
        self._dir = tempfile.mkdtemp(prefix="rlpost-sandbox-")
        self.port = 0
        self.restarts = 0
        self._proc: subprocess.Popen | None = None
        self._stopping = threading.Event()
        self._start()
        self._watch = threading.Thread(target=self._watchdog, name="sandbox-watchdog", daemon=True)
        self._watch.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/run_code"

    @property
    def pid(self) -> int:
        return self._proc.pid if self._proc else -1

    def _start(self) -> None:
        port_file = os.path.join(self._dir, "port")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(port_file)
        log = open(os.path.join(self._dir, "serve.log"), "ab")
        cmd = [sys.executable, "-m", "rlpost.sandbox.serve", "--port", str(self.port), "--port-file", port_file,
               "--workers", str(self.workers), "--queue", str(self.queue)] + ([] if self.seccomp else ["--no-seccomp"])
        self._proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not os.path.exists(port_file):
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self._proc.kill()
                with open(os.path.join(self._dir, "serve.log"), errors="replace") as f:
                    tail = f.read()[-2000:]
                raise RuntimeError(f"reward_model.sandbox_fusion.url=local: the sandbox service did not start "
                                   f"(exit code {self._proc.poll()}):\n{tail}")
            time.sleep(0.05)
        with open(port_file) as f:
            self.port = int(f.read())

    def _watchdog(self) -> None:
        while not self._stopping.wait(0.5):
            if self._proc is not None and self._proc.poll() is not None and not self._stopping.is_set():
                logger.warning("the local sandbox service (pid %d) ended with code %s; restarting it on port %d",
                               self._proc.pid, self._proc.returncode, self.port)
                self.restarts += 1
                try:
                    self._start()
                except RuntimeError as err:
                    logger.error("%s", err)
                    return

    def stop(self) -> None:
        """Stop the service and its programs (its session), then remove its folder."""
        self._stopping.set()
        self._watch.join(timeout=2)
        if self._proc is not None and self._proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._proc.pid, 15)
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self._proc.pid, 9)
                self._proc.wait()
        for name in ("serve.log", "port"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(self._dir, name))
        with contextlib.suppress(OSError):
            os.rmdir(self._dir)


@contextlib.contextmanager
def local_sandbox(workers: int) -> Iterator[LocalSandbox]:
    """A started `LocalSandbox`, stopped on exit."""
    box = LocalSandbox(workers)
    try:
        yield box
    finally:
        box.stop()
