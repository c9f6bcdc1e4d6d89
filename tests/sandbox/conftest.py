"""Checks of what a sandbox run leaves behind (the service itself: the `sandbox` fixture of tests/conftest.py)."""

import os
import time

import pytest


def descendants(pid: int) -> list[int]:
    """Processes whose parent chain reaches `pid` (from /proc), but its children (the jail's zygote)."""
    parents = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    parents[int(name)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    found, frontier = [], [p for p, pp in parents.items() if pp == pid]
    while frontier:
        current = frontier.pop()
        children = [p for p, pp in parents.items() if pp == current]
        found += children
        frontier += children
    return found


@pytest.fixture
def nothing_left(sandbox):
    """After the test the service has no process left under its zygote (handlers, programs, their children) within
    2 s.
    (Files: each test checks the paths its program writes; the box itself is a tmpfs of the program's mount
    namespace, gone with it.)"""
    yield
    deadline = time.monotonic() + 2
    while descendants(sandbox.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert descendants(sandbox.pid) == []
