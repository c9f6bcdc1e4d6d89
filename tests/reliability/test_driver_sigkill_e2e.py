"""SIGKILL of a training driver leaves no process behind: Ray's head processes share the driver's fate, each
worker ends itself within seconds when its driver is gone, and rlpost's reaper ends Ray's agents."""

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from _e2e import command, make_data

pytestmark = pytest.mark.e2e


def descendants(pid: int) -> dict[int, tuple[str, str]]:
    """{pid: (start time, command line)} of every process below `pid`."""
    parent, info = {}, {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()  # after "pid (comm)": state, ppid, ..., starttime is 20th
        parent[int(entry.name)], info[int(entry.name)] = int(fields[1]), (fields[19], cmdline)
    found, frontier = {}, [pid]
    while frontier:
        children = [p for p, pp in parent.items() if pp in frontier and p not in found]
        found.update({p: info[p] for p in children})
        frontier = children
    return found


def still_running(procs: dict[int, tuple[str, str]]) -> dict[int, str]:
    alive = {}
    for pid, (start, cmdline) in procs.items():
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[19] == start and fields[0] != "Z":  # same process (not a reused pid), not a zombie
            alive[pid] = cmdline
    return alive


@pytest.mark.timeout(300)
def test_sigkilled_driver_leaves_no_ray_process(tmp_path, tiny_model_dir):
    make_data(tmp_path)
    run_dir = tmp_path / "run"
    out = open(tmp_path / "driver.out", "w")
    proc = subprocess.Popen(command(tmp_path, tiny_model_dir, run_dir, "trainer.total_training_steps=500",
                                    "trainer.save_freq=-1"), stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 200
        while len(list((run_dir / "logs").glob("stack_rank*.txt"))) < 2:  # both workers started their roles
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "driver.out").read_text()[-3000:]
            time.sleep(0.2)
        time.sleep(2)  # into init_model: busy workers
        tree = descendants(proc.pid)
        workers = {p: c for p, (_, c) in tree.items() if c.startswith("ray::WorkerHost")}
        assert len(workers) == 2, tree
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        killed = time.monotonic()
        while still_running(tree) and time.monotonic() < killed + 20:
            time.sleep(0.2)
        assert still_running(tree) == {}, f"left running 20 s after the driver's SIGKILL: {still_running(tree)}"
        print(f"all {len(tree)} processes gone {time.monotonic() - killed:.1f} s after the SIGKILL")
        logs = "".join(p.read_text() for p in (run_dir / "logs").glob("worker_rank*.log"))
        assert logs.count(f"the driver (pid {proc.pid}) has exited: ending worker pid") == 2, logs[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
