"""The CPU cores near a GPU, and keeping a process on them.

On a host with more than one NUMA node each GPU hangs off one node's PCIe root; Linux names that node's cores in
`/sys/bus/pci/devices/<address>/local_cpulist`. A process that drives a GPU from a core of another node pays for
every launch and copy across the socket link, and the kernel may move it between nodes at any time.
"""

from __future__ import annotations

import os
from pathlib import Path

SYSFS = Path("/sys")
# what the process may use before anything narrows it (Linux; elsewhere nothing can be pinned)
_ALLOWED_AT_START = frozenset(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else frozenset()


def parse_cpulist(text: str) -> set[int]:
    """`0-3,8,10-11` -> {0, 1, 2, 3, 8, 10, 11} (the kernel's cpulist format; empty text -> empty set)."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def pci_address(domain: int, bus: int, device: int) -> str:
    """sysfs's name of function 0 of a PCI device: `0000:18:00.0`."""
    return f"{domain:04x}:{bus:02x}:{device:02x}.0"


def node_cpus(sysfs: Path = SYSFS) -> dict[int, set[int]]:
    """NUMA node -> its cores (empty when the kernel exposes no nodes)."""
    out = {}
    for node in sorted((sysfs / "devices" / "system" / "node").glob("node[0-9]*")):
        cpus = parse_cpulist((node / "cpulist").read_text()) if (node / "cpulist").exists() else set()
        if cpus:
            out[int(node.name.removeprefix("node"))] = cpus
    return out


def pci_local_cpus(address: str, sysfs: Path = SYSFS) -> set[int]:
    """The cores of the NUMA node the PCI device at `address` hangs off; empty when sysfs does not say."""
    path = sysfs / "bus" / "pci" / "devices" / address / "local_cpulist"
    return parse_cpulist(path.read_text()) if path.exists() else set()


def gpu_local_cpus(device: int = 0, sysfs: Path = SYSFS) -> set[int]:
    """The cores local to CUDA device `device` of this process; empty without CUDA or sysfs."""
    import torch

    if not torch.cuda.is_available():
        return set()
    props = torch.cuda.get_device_properties(device)
    ids = [getattr(props, f"pci_{k}_id", None) for k in ("domain", "bus", "device")]
    if any(v is None for v in ids):
        return set()
    return pci_local_cpus(pci_address(*ids), sysfs)


def set_process_affinity(cpus: set[int]) -> set[int]:
    """Keep every thread of this process on `cpus` (within the cores it was allowed when this module was imported,
    so a later call can widen it again); threads started later inherit it. Returns the cores applied; leaves the
    affinity alone and returns an empty set when none of `cpus` is allowed."""
    allowed = _ALLOWED_AT_START & set(cpus)
    if not allowed:
        return set()
    for task in Path("/proc/self/task").iterdir():
        try:
            os.sched_setaffinity(int(task.name), allowed)
        except (ProcessLookupError, PermissionError):  # a thread that ended meanwhile
            continue
    return allowed


def current_cpu() -> int:
    """The core this thread last ran on (field 39 of /proc/thread-self/stat)."""
    stat = Path("/proc/thread-self/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[36])
