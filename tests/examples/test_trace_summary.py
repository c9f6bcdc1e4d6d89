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
    assert walls[0] >= 50 and walls[1] >= 250  # the ranges span the sleeps
    assert "update_actor" in printed and "old_log_prob" in printed


def _x(cat: str, name: str, ts: float, dur: float) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 0, "tid": 0}


def write_trace(path: Path, events: list[dict]) -> Path:
    path.write_text(json.dumps({"traceEvents": events}))
    return path


def test_device_columns_nested_and_repeated_phases(tmp_path):
    """The GPU columns on a trace written the way torch's profiler writes one (microseconds): a nested phase
    is left out of its parent, a kernel running past its phase's end counts only up to it, NCCL kernels are
    comm, a phase called twice gets a second row, a rank without a phase gets no wait for it."""
    rank0 = write_trace(tmp_path / "step4_actor_rank0.json", [
        _x("user_annotation", "phase/update_actor", 0, 10_000),
        _x("kernel", "nvjet_gemm", 1_000, 3_000),
        _x("kernel", "ncclDevKernel_AllGather_RING_LL", 4_000, 2_000),
        _x("gpu_memcpy", "Memcpy HtoD", 500, 500),
        _x("user_annotation", "phase/update_weights", 7_000, 2_000),  # nested: left out of update_actor
        _x("kernel", "ncclDevKernel_AllGather_RING_LL", 7_500, 1_000),
        _x("user_annotation", "phase/gen", 20_000, 1_000),
        _x("kernel", "flash_fwd", 20_500, 1_500),  # runs 1 ms past the phase's end
        _x("user_annotation", "phase/gen", 30_000, 1_000),
        _x("cpu_op", "aten::mm", 1_000, 10),
    ])
    rank1 = write_trace(tmp_path / "step4_actor_rank1.json", [
        _x("user_annotation", "phase/update_actor", 0, 10_000),
        _x("kernel", "ncclDevKernel_AllGather_RING_LL", 4_000, 500),
    ])
    r0, r1 = trace_summary.summarize_trace(rank0), trace_summary.summarize_trace(rank1)
    assert list(r0["phases"]) == ["update_actor", "update_weights", "gen", "gen#2"]
    upd = r0["phases"]["update_actor"]
    assert upd["wall_ms"] == 8.0 and upd["kernels"] == 2 and upd["compute_ms"] == 3.0 and upd["comm_ms"] == 2.0
    assert upd["copy_ms"] == 0.5 and upd["busy_ms"] == 5.5 and upd["idle_ms"] == 2.5
    assert r0["phases"]["update_weights"]["comm_ms"] == 1.0 and r0["phases"]["update_weights"]["wall_ms"] == 2.0
    gen = r0["phases"]["gen"]
    assert gen["compute_ms"] == 1.5 and gen["busy_ms"] == 0.5 and gen["idle_ms"] == 0.5
    assert r0["phases"]["gen#2"]["kernels"] == 0 and list(upd["top_ms"])[0] == "nvjet_gemm"
    trace_summary.add_waits([r0, r1])
    assert upd["wait_ms"] == 1.5 and r1["phases"]["update_actor"]["wait_ms"] == 0.0
    assert r0["phases"]["update_weights"]["wait_ms"] == 0.0  # only rank 0 has it
    table = trace_summary.format_table([r0, r1])
    assert table.splitlines()[1].split()[:3] == ["update_actor", "0", "8.0"]
    with pytest.raises(ValueError, match="must carry its rank"):
        trace_summary.summarize_trace(write_trace(tmp_path / "step4_actor.json", []))


def test_union_length():
    assert trace_summary.union_length([(0, 4), (2, 6), (10, 11), (3, 5)]) == 7
