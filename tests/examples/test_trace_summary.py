"""scripts/trace_summary.py on real torch traces written by the worker-side profiler session (CPU here; the
GPU columns are checked in tests/gpu/test_profiling_gpu.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from rlpost.utils.profiler import SESSION, ProfileOptions, phase

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
import trace_summary  # noqa: E402

pytestmark = pytest.mark.timeout(120)


@phase("old_log_prob")
def log_prob(n: int) -> None:
    a = torch.ones(n, n)
    for _ in range(3):
        a = a @ a / n


@phase("update_actor")
def update(pause: float) -> None:
    time.sleep(pause)
    torch.ones(64, 64).sum()


def profile_step(tmp_path: Path, rank: int, pause: float) -> Path:
    opts = ProfileOptions(role="actor", tool="torch", ranks=None, save_path=str(tmp_path), discrete=False,
                          contents=("cpu",), max_entries=1000)
    SESSION.start(4, opts, rank=rank)
    log_prob(256)
    update(pause)
    SESSION.stop("actor")
    SESSION.written.clear()
    return tmp_path / f"step4_actor_rank{rank}.json"


def test_phases_of_each_rank_with_their_wall_and_longest_operators(tmp_path):
    paths = [profile_step(tmp_path, 0, 0.05), profile_step(tmp_path, 1, 0.25)]
    out = tmp_path / "summary.json"
    printed = subprocess.run([sys.executable, str(REPO / "scripts" / "trace_summary.py"), *map(str, paths),
                              "--json-out", str(out)], check=True, capture_output=True, text=True,
                             timeout=60).stdout
    ranks = json.loads(out.read_text())["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1]
    for r in ranks:
        assert list(r["phases"]) == ["old_log_prob", "update_actor"]  # the order they ran in
        lp = r["phases"]["old_log_prob"]
        assert "aten::mm" in lp["top_ms"] and lp["wall_ms"] > 0
        assert lp["kernels"] == 0 and "busy_ms" not in lp and "wait_ms" not in lp  # no device columns on CPU
    walls = [r["phases"]["update_actor"]["wall_ms"] for r in ranks]
    assert 50 <= walls[0] < 250 <= walls[1]  # the ranges span the sleeps
    assert "update_actor" in printed and "old_log_prob" in printed


def test_union_and_waits():
    assert trace_summary.union_length([(0, 4), (2, 6), (10, 11), (3, 5)]) == 7
    ranks = [{"rank": 0, "phases": {"ref": {"comm_ms": 30.0}}}, {"rank": 1, "phases": {"ref": {"comm_ms": 12.0}}}]
    trace_summary.add_waits(ranks)
    assert [r["phases"]["ref"]["wait_ms"] for r in ranks] == [18.0, 0.0]
