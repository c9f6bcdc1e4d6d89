"""benchmarks/bench_collectives.py on gloo: every size timed at every world size, with its bytes and bandwidth."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import harness

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(120)


def test_each_collective_at_each_world_size(tmp_path):
    out = tmp_path / "c.json"
    subprocess.run([sys.executable, str(REPO / "benchmarks" / "bench_collectives.py"), "--world-sizes", "2",
                    "--backend", "gloo", "--device", "cpu", "--params", "60000", "--layer-params", "9000", "--reps", "3",
                    "--json-out", str(out)], check=True, timeout=100)
    res = json.loads(out.read_text())
    harness.validate(res)
    assert res["env"]["commit"] == res["commit"] and "bench_collectives" in res["command"] and res["reps"] == 3
    assert len(res["metrics"]["model_all_gather_bf16_x2_ms"]["values"]) == 3
    rows = {r["name"]: r for r in res["results"]}
    assert rows["model all-gather bf16"]["bytes"] == 60000 * 2 and rows["model reduce-scatter fp32"]["bytes"] == 60000 * 4
    assert rows["layer all-gather bf16"]["bytes"] == 9000 * 2 and rows["layer reduce-scatter fp32"]["bytes"] == 9000 * 4
    for r in rows.values():
        assert r["world"] == 2 and r["ms_range"][0] <= r["ms"] <= r["ms_range"][1] and r["bus_gb_per_s"] > 0
