"""benchmarks/bench_chunk_stats.py on a small CPU chunk: every variant timed each repetition, same entropies."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_chunk_stats  # noqa: E402

from benchmarks import harness  # noqa: E402

pytestmark = pytest.mark.timeout(60)


def test_bench_alternates_variants_and_writes_its_json(tmp_path):
    out = tmp_path / "r.json"
    res = bench_chunk_stats.main(["--device", "cpu", "--rows", "16", "--vocab", "300", "--reps", "3",
                                  "--json-out", str(out)])
    written = json.loads(out.read_text())
    harness.validate(written)
    assert written["gpu"] == "cpu" and written["reps"] == 3
    assert written["metrics"]["chunk_stats_s"]["values"] == res["chunk_stats"]["all_s"]
    for name in ("softmax_formula", "chunk_stats", "no_entropy"):
        assert len(res[name]["all_s"]) == 3 and res[name]["min_s"] <= res[name]["median_s"] <= res[name]["max_s"]
    assert res["max_entropy_diff"] < 1e-4
