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
