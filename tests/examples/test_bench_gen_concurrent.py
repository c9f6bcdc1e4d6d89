"""scripts/bench_gen_concurrent.py: the alternating solo/all schedule, the summary maths, and a real run of the
training phase in two CPU processes (the generation phase builds vLLM engines: timed on the GPU host)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))

import bench_gen_concurrent as bgc  # noqa: E402

pytestmark = pytest.mark.timeout(180)


def test_modes_alternate_which_goes_first():
    assert [bgc.order(r) for r in range(4)] == [("solo", "all"), ("all", "solo")] * 2


def test_summary_takes_the_slowest_rank_and_the_median_rep():
    times = {"gen": {"solo": [[2.0], [1.0], [3.0]],
                     "all": [[2.0, 2.5, 2.2], [1.9, 4.0, 2.0], [2.1, 2.2, 2.4]]}}
    s = bgc.summarize(times)["gen"]
    assert s["solo_s"] == 2.0 and s["solo_range"] == [1.0, 3.0]
    assert s["all_s"] == 2.5 and s["all_range"] == [2.4, 4.0]  # slowest rank per repetition: 2.5, 4.0, 2.4
    assert s["all_rank_median_s"] == 2.2  # median ranks 2.2, 2.0, 2.2
    assert s["efficiency"] == pytest.approx(2.0 / 2.5)


def test_training_phase_runs_in_two_processes(tmp_path, tiny_model_dir):
    out = tmp_path / "c.json"
    subprocess.run([sys.executable, str(REPO / "scripts" / "bench_gen_concurrent.py"), "--gpus", "2", "--phases",
                    "train", "--model-dir", tiny_model_dir, "--prompts", "2", "--n", "2", "--prompt-len", "6",
                    "--response-len", "6", "--micro", "2", "--reps", "3", "--timeout", "150",
                    "--json-out", str(out)], check=True, timeout=170, cwd=REPO)
    res = json.loads(out.read_text())
    assert "rlpost_commit" in res["env"] and res["args"]["phases"] == ["train"]
    times = res["times"]["train"]
    assert len(times["solo"]) == 3 and all(len(t) == 1 and t[0] > 0 for t in times["solo"])
    assert len(times["all"]) == 3 and all(len(t) == 2 and min(t) > 0 for t in times["all"])
    s = res["summary"]["train"]
    assert s["solo_range"][0] <= s["solo_s"] <= s["solo_range"][1] and s["efficiency"] == pytest.approx(
        s["solo_s"] / s["all_s"])
