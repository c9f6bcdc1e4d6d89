"""benchmarks/bench_dispatch.py on local Ray: every side timed each round at every rank count, the log-probs of
every row gathered back."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import harness

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(240)


def test_bench_times_each_wire_format_at_each_rank_count(tmp_path):
    out = tmp_path / "d.json"
    subprocess.run([sys.executable, str(REPO / "benchmarks" / "bench_dispatch.py"), "--ranks", "1", "2",
                    "--rows-per-rank", "8", "--prompt-len", "16", "--response-len", "8", "--reps", "2",
                    "--json-out", str(out)], check=True, timeout=220)
    res = json.loads(out.read_text())
    harness.validate(res)
    assert [r["ranks"] for r in res["results"]] == [1, 2] and res["env"]["cpu_count"] and res["reps"] == 2
    assert res["metrics"]["numpy_x2_s"]["values"] == res["results"][1]["numpy"]["all_s"]
    for row in res["results"]:
        # int64 prompts 16, responses 8, input_ids/attention_mask/position_ids 24 each, response_mask 8; float scores 8
        assert row["rows"] == 8 * row["ranks"]
        assert row["input_bytes"] == row["rows"] * ((16 + 8 + 3 * 24 + 8) * 8 + 8 * 4)
        for side in ("numpy", "torch", "empty"):
            t = row[side]
            assert len(t["all_s"]) == 2 and 0 < t["min_s"] <= t["median_s"] <= t["max_s"]
