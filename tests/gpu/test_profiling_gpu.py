"""On a GPU: per-phase peak memory, CUDA memory snapshots and CUDA kernels in torch traces."""

import json
import pickle

import pytest
import torch

from rlpost.utils.profiler import SESSION, ProfileOptions, drain_phase_peaks, lifetime_peaks, phase

pytestmark = pytest.mark.timeout(120)


def options(tmp_path, tool: str) -> ProfileOptions:
    return ProfileOptions(role="actor", tool=tool, ranks=None, save_path=str(tmp_path), discrete=False,
                          contents=("cpu", "cuda"), max_entries=10000)


@phase("update_weights")
def inner() -> None:
    x = torch.empty(2 * 2**30, dtype=torch.uint8, device="cuda")  # 2 GiB
    del x


@phase("update_actor", report=False)
def outer() -> None:
    x = torch.empty(2**30, dtype=torch.uint8, device="cuda")  # 1 GiB, alive across the inner phase
    inner()
    del x


def test_phase_peaks_nest():
    torch.cuda.init()
    torch.empty(1, device="cuda")
    drain_phase_peaks()
    live = torch.cuda.memory_allocated() / 2**30  # what earlier tests in this process still hold
    outer()
    peaks = drain_phase_peaks()
    assert peaks["perf/max_memory_allocated_gb/update_weights"] == pytest.approx(live + 3.0, abs=0.05)
    assert peaks["perf/max_memory_allocated_gb/update_actor"] == pytest.approx(live + 3.0, abs=0.05)
    assert drain_phase_peaks() == {}
    small = torch.empty(1, device="cuda")
    with_phase = phase("gen")(lambda: small + 1)
    with_phase()  # resets the peak statistics; the process's lifetime peak survives it
    assert lifetime_peaks()[0] >= 3 * 2**30


def test_torch_memory_snapshot_and_cuda_trace(tmp_path):
    SESSION.start(1, options(tmp_path, "torch_memory"), rank=0)
    outer()
    SESSION.stop("actor")
    snapshot = pickle.loads((tmp_path / "step1_actor_rank0.pickle").read_bytes())
    assert snapshot["segments"] and snapshot["device_traces"][0]  # allocations were recorded
    SESSION.start(2, options(tmp_path, "torch"), rank=0)
    a = torch.randn(1024, 1024, device="cuda")
    (a @ a).sum().item()
    SESSION.stop("actor")
    events = json.loads((tmp_path / "step2_actor_rank0.json").read_text())["traceEvents"]
    assert any(e.get("cat") == "kernel" for e in events)
    SESSION.written.clear()



def test_trace_summary_counts_a_phase_s_kernels_as_compute(tmp_path):
    """scripts/trace_summary.py on a CUDA trace: the phase's matmuls are compute, the GPU is busy for part of
    the host range. (NCCL kernels, the comm column, need 2 ranks: a 1-rank all-reduce launches none; the
    4-GPU `bench_scale --profile-step` run of docs/benchmarks/scale.md shows them per rank.)"""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
    import trace_summary

    a = torch.randn(2048, 2048, device="cuda")

    @phase("update_actor")
    def step() -> None:
        for _ in range(20):
            (a @ a).sum()
        torch.cuda.synchronize()

    step()
    SESSION.start(3, options(tmp_path, "torch"), rank=0)
    step()
    SESSION.stop("actor")
    SESSION.written.clear()
    row = trace_summary.summarize_trace(tmp_path / "step3_actor_rank0.json")["phases"]["update_actor"]
    assert row["compute_ms"] > 0 and row["comm_ms"] == 0 and row["kernels"] >= 40 and row["top_ms"]
    assert 0 < row["busy_ms"] <= row["wall_ms"] and row["idle_ms"] >= 0
