"""`python rlpost/single_controller/ray/reaper.py <driver pid>`: end the Ray processes of a driver that died.

A driver that exits normally shuts Ray down. One killed by SIGKILL cannot: Ray's head processes share its
fate, and rlpost's workers end themselves (`diagnostics._exit_with_driver`), but Ray's agents
(`ray::DashboardAgent`, `ray::RuntimeEnvAgent`) and idle workers linger for minutes. This small process,
started by `init_ray` in a session of its own, notes the driver's Ray processes every few seconds while the
driver lives and, once it is gone, ends those still running (SIGTERM, then SIGKILL).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

_POLL_S = 1.0
_SNAPSHOT_EVERY = 3  # polls between two notes of the driver's Ray processes
_TERM_GRACE_S = 3.0


def start_reaper(driver_pid: int) -> subprocess.Popen | None:
    """Start the reaper for `driver_pid` (Linux only: it reads /proc); returns its process."""
    if not Path("/proc/self/stat").exists():
        return None
    # run as a plain script: `-m` would import the package (and Ray) into a process that only watches
    return subprocess.Popen([sys.executable, os.path.abspath(__file__), str(driver_pid)], start_new_session=True,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def ray_descendants(pid: int) -> dict[int, str]:
    """{pid: start time} of the Ray processes below `pid` (Ray's binaries and `ray::` workers)."""
    parent, start, is_ray = {}, {}, {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        child = int(entry.name)
        parent[child], start[child] = int(fields[1]), fields[19]
        is_ray[child] = cmdline.startswith(b"ray::") or b"/ray/" in cmdline
    found, frontier = set(), {pid}
    while frontier:
        frontier = {p for p, pp in parent.items() if pp in frontier and p not in found}
        found |= frontier
    return {p: start[p] for p in found if is_ray[p] and p != os.getpid()}


def _alive(procs: dict[int, str]) -> list[int]:
    """The processes of `procs` still running as themselves (a reused pid has another start time)."""
    alive = []
    for pid, started in procs.items():
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[19] == started and fields[0] != "Z":
            alive.append(pid)
    return alive


def _signal(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:  # it exited since the scan, or is not ours to signal: nothing left to end
            continue


def reap(driver_pid: int) -> None:
    """Watch `driver_pid`; when it is gone, end the Ray processes noted while it lived."""
    try:
        driver = {driver_pid: Path(f"/proc/{driver_pid}/stat").read_text().rsplit(")", 1)[1].split()[19]}
    except OSError:
        return
    noted: dict[int, str] = {}
    polls = 0
    while _alive(driver):
        if polls % _SNAPSHOT_EVERY == 0:
            noted.update(ray_descendants(driver_pid))
        polls += 1
        time.sleep(_POLL_S)
    _signal(_alive(noted), signal.SIGTERM)
    deadline = time.monotonic() + _TERM_GRACE_S
    while _alive(noted) and time.monotonic() < deadline:
        time.sleep(0.2)
    _signal(_alive(noted), signal.SIGKILL)


if __name__ == "__main__":
    reap(int(sys.argv[1]))
