"""rlpost.utils.numa: the kernel's cpulist format, a GPU's local cores from a sysfs tree, and the affinity of every
thread of this process."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from rlpost.utils import numa

pytestmark = pytest.mark.timeout(60)


def test_parse_cpulist():
    assert numa.parse_cpulist("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}
    assert numa.parse_cpulist("") == set()
    assert numa.pci_address(0, 0x18, 0) == "0000:18:00.0"


def _sysfs(root: Path) -> Path:
    for node, cpus in ((0, "0-3,8-11"), (1, "4-7,12-15")):
        d = root / "devices" / "system" / "node" / f"node{node}"
        d.mkdir(parents=True)
        (d / "cpulist").write_text(cpus + "\n")
    dev = root / "bus" / "pci" / "devices" / "0000:9a:00.0"
    dev.mkdir(parents=True)
    (dev / "local_cpulist").write_text("4-7,12-15\n")
    return root


def test_nodes_and_a_devices_local_cores_from_sysfs(tmp_path):
    sysfs = _sysfs(tmp_path)
    assert numa.node_cpus(sysfs) == {0: {0, 1, 2, 3, 8, 9, 10, 11}, 1: {4, 5, 6, 7, 12, 13, 14, 15}}
    assert numa.pci_local_cpus("0000:9a:00.0", sysfs) == {4, 5, 6, 7, 12, 13, 14, 15}
    assert numa.pci_local_cpus("0000:01:00.0", sysfs) == set()  # no such device: nothing to pin to
    assert numa.node_cpus(tmp_path / "none") == {}
    assert numa.gpu_local_cpus(0, sysfs) == set()  # no CUDA here


def test_affinity_reaches_every_thread_and_ignores_cores_not_allowed():
    before = os.sched_getaffinity(0)
    one = min(before)
    stop = threading.Event()
    worker = threading.Thread(target=stop.wait, daemon=True)
    worker.start()
    try:
        assert numa.set_process_affinity({one, 10_000}) == {one}
        assert os.sched_getaffinity(worker.native_id) == {one}  # a thread started before the call
        assert numa.current_cpu() == one
        assert numa.set_process_affinity({10_000}) == set()  # nothing allowed: left alone
        assert os.sched_getaffinity(0) == {one}
    finally:
        numa.set_process_affinity(before)
        stop.set()
    assert os.sched_getaffinity(0) == before
