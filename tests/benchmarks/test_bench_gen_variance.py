"""benchmarks/bench_gen_variance.py: the host's shares from /proc/stat, the scheduler-step and GPU-sample summaries, the
round-robin order and the correlations (the engine itself runs on the GPU host)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import bench_gen_variance as bgv  # noqa: E402

pytestmark = pytest.mark.timeout(60)


def test_host_shares_from_two_reads_of_proc_stat():
    before = bgv.parse_proc_stat("cpu  100 0 50 800 10 0 0 40 0 0\ncpu0 1 2 3 4 5 6 7 8\nintr 5\n")
    after = bgv.parse_proc_stat("cpu  160 0 70 900 10 0 0 60 0 0\ncpu0 1 2 3 4 5 6 7 8\n")
    assert before == {"user": 100, "nice": 0, "system": 50, "idle": 800, "iowait": 10, "irq": 0, "softirq": 0,
                      "steal": 40}
    shares = bgv.host_shares(before, after)  # +60 user +20 system +100 idle +20 steal = 200
    assert shares == pytest.approx({"host_busy": 80 / 200, "host_steal": 20 / 200})
    assert bgv.parse_proc_stat(Path("/proc/stat").read_text())["idle"] > 0  # this machine's own file parses


def test_step_stats_count_the_stalls():
    steps = [0.010] * 9 + [0.050]
    s = bgv.step_stats(steps)
    assert s["steps"] == 10 and s["step_median_ms"] == pytest.approx(10.0) and s["step_max_ms"] == pytest.approx(50.0)
    assert s["stall_s"] == pytest.approx(0.050)  # only the step over 3x the median
    assert bgv.step_stats([])["steps"] == 0


def test_window_stats_keep_the_samples_inside_the_repetition():
    samples = [(t, {"clocks.sm": c, "utilization.gpu": u, "power.draw": 300.0, "temperature.gpu": 40.0 + t,
                    "clocks_event_reasons.active": r})
               for t, c, u, r in ((0.5, 1000.0, 10.0, "0x0"), (1.0, 1980.0, 90.0, "0x0"), (1.5, 1500.0, 70.0, "0x4"),
                                  (3.0, 500.0, 0.0, "0x1"))]
    w = bgv.window_stats(samples, 1.0, 2.0)
    assert w["gpu_samples"] == 2 and w["sm_clock_min_mhz"] == 1500.0 and w["gpu_util_mean"] == 80.0
    assert w["clock_event_reasons"] == ["0x0", "0x4"] and w["temp_max_c"] == 41.5
    assert bgv.window_stats(samples, 5.0, 6.0) == {"gpu_samples": 0}


def test_round_robin_moves_the_first_variant():
    assert bgv.schedule(3, ("a", "b", "c")) == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]


def test_correlation_with_wall_time():
    records = [{"rep": i, "variant": "default", "wall_s": w, "process_cpu_s": w * 2, "host_steal": s}
               for i, (w, s) in enumerate(((1.0, 0.3), (2.0, 0.2), (3.0, 0.1), (4.0, 0.0)))]
    r = bgv.correlations(records)
    assert r["process_cpu_s"] == pytest.approx(1.0) and r["host_steal"] == pytest.approx(-1.0)
    assert "rep" not in r and "variant" not in r
    # a repetition without GPU samples has no clock: left out of that correlation, not counted as 0 MHz
    clocks = [{"sm_clock_min_mhz": c, "gpu_samples": 5} for c in (1980.0, 1500.0, None, 1000.0)]
    r = bgv.correlations([{**rec, **({k: v for k, v in c.items() if v is not None})}
                          for rec, c in zip(records, clocks)])
    assert r["sm_clock_min_mhz"] == pytest.approx(bgv.pearson([1.0, 2.0, 4.0], [1980.0, 1500.0, 1000.0]))
    assert "gpu_samples" not in r
    assert bgv.pearson([1.0, 1.0, 1.0], [1.0, 2.0, 3.0]) is None


def test_engine_length_is_its_own_flag():
    base = ["--model-dir", "/tmp/m", "--prompt-len", "28", "--response-len", "512"]
    assert bgv.parse_args(base).max_model_len is None  # the engine gets prompt + response
    assert bgv.parse_args([*base, "--max-model-len", "1024", "--variants", "default", "tqdm"]).max_model_len == 1024
    with pytest.raises(SystemExit):  # bare_engine takes the length positionally: two values would collide
        bgv.parse_args([*base, "--engine-kwargs", '{"max_model_len": 1024}'])
    with pytest.raises(SystemExit):
        bgv.parse_args([*base, "--max-model-len", "512"])


def test_cpu_probe_times_the_loop():
    fast, slow = bgv.cpu_probe_ms(loops=1_000, reps=2), bgv.cpu_probe_ms(loops=200_000, reps=2)
    assert 0 < fast < slow  # 200x the loop takes longer: the probe times the work, not a constant


def test_memory_probe_and_rusage_delta():
    assert 0.1 < bgv.memory_probe_gbs(mib=8, reps=2) < 10_000  # GB/s of a real copy on this machine
    import resource

    before = resource.getrusage(resource.RUSAGE_SELF)
    bgv.cpu_probe_ms(loops=1_000_000, reps=1)  # ~50 ms: several clock ticks of CPU time
    d = bgv.rusage_delta(before, resource.getrusage(resource.RUSAGE_SELF))
    assert set(d) == {"user_s", "sys_s", "minor_faults", "vol_switches", "invol_switches"}
    assert d["user_s"] > 0 and all(v >= 0 for v in d.values())
