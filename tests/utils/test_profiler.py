"""The worker-side profiler session: which captures a step makes and the files they write."""

import json

import pytest
import torch

from rlpost.utils.profiler import SESSION, ProfileOptions, drain_phase_peaks, phase

pytestmark = pytest.mark.timeout(60)


def options(tmp_path, role="actor", discrete=False, ranks=None) -> ProfileOptions:
    return ProfileOptions(role=role, tool="torch", ranks=ranks, save_path=str(tmp_path), discrete=discrete,
                          contents=("cpu",), max_entries=1000)


@phase("update_actor")
def work() -> torch.Tensor:
    return (torch.ones(64, 64) @ torch.ones(64, 64)).sum()


def written() -> list[str]:
    out, SESSION.written = SESSION.written, []
    return out


def test_one_trace_per_step_for_colocated_roles(tmp_path):
    SESSION.start(3, options(tmp_path, "actor"), rank=1)
    SESSION.start(3, options(tmp_path, "ref"), rank=1)
    work()
    SESSION.stop("actor")
    assert written() == []  # the reference is still inside the step
    SESSION.stop("ref")
    path = tmp_path / "step3_actor+ref_rank1.json"
    assert written() == [str(path)]
    events = json.loads(path.read_text())["traceEvents"]
    assert any(e.get("name") == "aten::mm" for e in events)


def test_discrete_captures_each_phase_and_ranks_filter(tmp_path):
    SESSION.start(2, options(tmp_path, discrete=True), rank=0)
    work()
    SESSION.stop("actor")
    assert written() == [str(tmp_path / "step2_update_actor_rank0.json")]
    SESSION.start(2, options(tmp_path, ranks=(1,)), rank=0)  # rank 0 is not listed: nothing captured
    work()
    SESSION.stop("actor")
    assert written() == []
    assert drain_phase_peaks() == {}  # CPU: no device peaks


@phase("generate_sequences")
def generate() -> torch.Tensor:
    return (torch.ones(32, 32) @ torch.ones(32, 32)).sum()


def test_discrete_actor_and_rollout_capture_each_phase_of_their_process(tmp_path):
    """The rollout runs in the actor's process; with both discrete, each phase is its own capture (a rollout
    without `discrete` would hold one step capture, and no phase could have its own)."""
    SESSION.start(1, options(tmp_path, "actor", discrete=True), rank=0)
    SESSION.start(1, options(tmp_path, "rollout", discrete=True), rank=0)
    generate()
    work()
    SESSION.stop("rollout")
    SESSION.stop("actor")
    assert written() == [str(tmp_path / "step1_generate_sequences_rank0.json"),
                         str(tmp_path / "step1_update_actor_rank0.json")]


GIB = 2**30


def test_peaks_leave_out_bytes_counted_without_device_memory():
    """A sleeping engine's pool stays in the allocator's counters: phases it sleeps through report their peak
    without it; when part of it wakes inside a phase (weights woken by the sync nested in the update), the
    earlier part of the phase is still measured without it; nested phases fold into the enclosing one."""
    from rlpost.utils.profiler import PeakTracker

    t = PeakTracker()
    t.set_unbacked(40 * GIB)  # the engine sleeps: 40 GiB counted (15 weights + 25 KV), none on the device
    t.enter(raw_allocated=60 * GIB, raw_reserved=62 * GIB)  # update_actor opens
    t.set_unbacked(40 * GIB, raw_allocated=77 * GIB, raw_reserved=78 * GIB)  # its training peak: 37 backed
    t.enter(raw_allocated=60 * GIB, raw_reserved=0)  # update_weights opens inside it
    t.set_unbacked(25 * GIB, raw_allocated=62 * GIB, raw_reserved=0)  # the weights wake: 15 GiB now backed
    t.exit("update_weights", raw_allocated=64 * GIB)  # 64 - 25 = 39 backed while loading
    t.exit("update_actor", raw_allocated=61 * GIB)
    assert t.peaks == {"update_weights": 39.0, "update_actor": 39.0}
    t.enter(raw_allocated=61 * GIB, raw_reserved=66 * GIB)
    t.set_unbacked(0, raw_allocated=62 * GIB, raw_reserved=66 * GIB)  # the KV cache wakes inside `gen`
    t.exit("gen", raw_allocated=72 * GIB)
    assert t.peaks["gen"] == 72.0
    assert t.lifetime(raw_allocated=72 * GIB, raw_reserved=74 * GIB) == (72 * GIB, 74 * GIB)
    t.set_unbacked(40 * GIB, raw_allocated=72 * GIB, raw_reserved=74 * GIB)
    t.enter(raw_allocated=50 * GIB, raw_reserved=50 * GIB)
    t.exit("ref", raw_allocated=55 * GIB)
    assert t.peaks["ref"] == 15.0
    assert t.lifetime(raw_allocated=50 * GIB, raw_reserved=50 * GIB) == (72 * GIB, 74 * GIB)  # earlier peak kept


def test_block_peak_spans_the_resets_of_the_phases_inside_it(monkeypatch):
    """A benchmark's block around a worker call sees the peak reached inside the worker's phase, although
    the phase reset the allocator's counters on entry and exit (counter readings fed in order)."""
    from rlpost.utils import profiler

    readings = iter([(5 * GIB, 6 * GIB),  # the block opens
                     (9 * GIB, 9 * GIB),  # the worker's phase opens: peak since the block opened
                     (30 * GIB, 31 * GIB),  # the phase closes: its peak
                     (12 * GIB, 31 * GIB)])  # the block closes: what followed the phase
    monkeypatch.setattr(profiler, "_counters", lambda: next(readings))
    monkeypatch.setattr(profiler, "TRACKER", profiler.PeakTracker())  # the process's own records stay as they are
    with profiler.block_peak() as block:
        with profiler.phase_memory("update_actor"):
            pass
    assert block == {"gib": 30.0}
    assert drain_phase_peaks() == {profiler.PEAK_PREFIX + "update_actor": 30.0}  # the block leaves no entry
