"""benchmarks/bench_actor_gap.py on the CPU (tiny model), run as a user runs it (its own process: the bench builds a
worker that sets the rank variables and a process group): every phase timed each repetition, ratios and profiles
written."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import bench_actor_gap  # noqa: E402

from benchmarks import harness  # noqa: E402

pytestmark = pytest.mark.timeout(240)


def test_bench_times_each_phase_and_profiles_each(tmp_path):
    done = subprocess.run([sys.executable, str(BENCHMARKS / "bench_actor_gap.py"), "--toy", "--reps", "2",
                           "--out-dir", str(tmp_path), "--tag", "t"], capture_output=True, text=True, timeout=230)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    res = json.loads((tmp_path / "actor_gap_toy_t.json").read_text())
    harness.validate(res)
    assert res["benchmark"] == "actor_gap_toy_t" and res["reps"] == 2
    assert res["metrics"]["bare_train_s"]["values"] == res["bare_train"]["all_s"]
    assert res["tokens"] == {"real": 8 * (6 + 16), "padded": 8 * (16 + 16)}
    for name in bench_actor_gap.PHASES:
        assert len(res[name]["all_s"]) == 2 and res[name]["min_s"] <= res[name]["median_s"] <= res[name]["max_s"]
        prof = res["profile"][name]
        assert prof["wall_s"] > 0 and prof["aten_ops"] > 0 and prof["device_busy_s"] is None  # no GPU here
    assert res["ratios"]["update"] == res["bare_train"]["median_s"] / res["rlpost_update"]["median_s"]
    assert "[gap] bare / rlpost:" in done.stdout


def test_busy_time_is_the_union_of_intervals():
    assert bench_actor_gap.busy_seconds([(0, 2e6), (1e6, 3e6), (5e6, 6e6), (5.5e6, 5.6e6)]) == 4.0
