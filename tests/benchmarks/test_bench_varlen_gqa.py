"""benchmarks/bench_varlen_gqa.py on the CPU: both sides timed each round, the same outputs and gradients."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import harness

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(120)


def test_bench_times_both_sides_and_writes_equal_results(tmp_path):
    out = tmp_path / "g.json"
    subprocess.run([sys.executable, str(REPO / "benchmarks" / "bench_varlen_gqa.py"), "--device", "cpu",
                    "--seq-lens", "7", "12", "5", "--heads", "4", "--kv-heads", "2", "--dim", "8",
                    "--reps", "2", "--rounds", "2", "--json-out", str(out)], check=True, timeout=100)
    res = json.loads(out.read_text())
    harness.validate(res)
    assert res["tokens"] == 24 and res["varlen_kernel"] is False and res["reps"] == 4
    assert res["metrics"]["native_fwd_ms"]["values"] == res["sides"]["native"]["fwd"]["all_ms"]
    for side in ("repeat", "native"):
        for phase in ("fwd", "fwd_bwd"):
            t = res["sides"][side][phase]
            assert len(t["all_ms"]) == 4 and t["min_ms"] <= t["median_ms"] <= t["max_ms"]
    for name in ("out", "dq", "dk", "dv"):
        assert res["native_vs_repeat"][name]["max_abs"] < 1e-5
