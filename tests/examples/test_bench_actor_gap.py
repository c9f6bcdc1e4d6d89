"""scripts/bench_actor_gap.py on the CPU (tiny model): every phase timed each repetition, ratios and profiles
written."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

import bench_actor_gap  # noqa: E402

pytestmark = pytest.mark.timeout(240)


def test_bench_alternates_phases_and_profiles_each(tmp_path):
    res = bench_actor_gap.main(["--toy", "--reps", "2", "--out-dir", str(tmp_path), "--tag", "t"])
    saved = json.loads((tmp_path / "actor_gap_cpu_toy_t.json").read_text())
    assert saved["tokens"] == {"real": 8 * (6 + 16), "padded": 8 * (16 + 16)}
    for name in bench_actor_gap.PHASES:
        assert len(res[name]["all_s"]) == 2 and res[name]["min_s"] <= res[name]["median_s"] <= res[name]["max_s"]
        prof = res["profile"][name]
        assert prof["wall_s"] > 0 and prof["aten_ops"] > 0 and prof["device_busy_s"] is None  # no GPU here
    assert res["ratios"]["update"] == res["bare_train"]["median_s"] / res["rlpost_update"]["median_s"]


def test_busy_time_is_the_union_of_intervals():
    assert bench_actor_gap.busy_seconds([(0, 2e6), (1e6, 3e6), (5e6, 6e6), (5.5e6, 5.6e6)]) == 4.0
