"""benchmarks/bench_gen_concurrent.py: the alternating solo/all schedule, the summary maths, each rank's GPU, and a
real run of the training phase in two CPU processes (the generation phase builds vLLM engines: timed on the GPU
host)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import bench_gen_concurrent as bgc  # noqa: E402

from benchmarks import harness  # noqa: E402

pytestmark = pytest.mark.timeout(180)


def test_modes_alternate_and_the_solo_rank_moves_round():
    assert [bgc.harness.order(r, bgc.MODES) for r in range(4)] == [["solo", "all"], ["all", "solo"]] * 2
    assert [bgc.solo_rank(r, 3) for r in range(5)] == [0, 1, 2, 0, 1]


def test_each_rank_gets_one_of_the_visible_gpus(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5,6")
    assert bgc._devices(2, cuda=True) == ["3", "5"]
    assert bgc._devices(2, cuda=False) == [None, None]
    with pytest.raises(SystemExit, match="--gpus 4 but 3 GPU"):
        bgc._devices(4, cuda=True)


def test_summary_takes_the_slowest_rank_and_the_median_rep():
    times = {"gen": {"solo": [[2.0], [1.0], [3.0]],
                     "all": [[2.0, 2.5, 2.2], [1.9, 4.0, 2.0], [2.1, 2.2, 2.4]]}}
    s = bgc.summarize(times)["gen"]
    assert s["solo_s"] == 2.0 and s["solo_range"] == [1.0, 3.0]
    assert s["all_s"] == 2.5 and s["all_range"] == [2.4, 4.0]  # slowest rank per repetition: 2.5, 4.0, 2.4
    assert s["all_rank_median_s"] == 2.2  # median ranks 2.2, 2.0, 2.2
    assert s["efficiency"] == pytest.approx(2.0 / 2.5)
    assert s["paired_efficiency"] == pytest.approx(2.0 / 2.5)  # per repetition 2/2.5, 1/4, 3/2.4


def test_training_phase_runs_in_two_processes(tmp_path, tiny_model_dir):
    out = tmp_path / "c.json"
    subprocess.run([sys.executable, str(REPO / "benchmarks" / "bench_gen_concurrent.py"), "--gpus", "2", "--phases",
                    "train", "--model-dir", tiny_model_dir, "--prompts", "2", "--n", "2", "--prompt-len", "6",
                    "--response-len", "6", "--micro", "2", "--reps", "3", "--timeout", "150",
                    "--json-out", str(out)], check=True, timeout=170, cwd=REPO)
    res = json.loads(out.read_text())
    harness.validate(res)
    assert res["benchmark"] == "gen_concurrent_x2" and res["args"]["phases"] == ["train"] and res["reps"] == 3
    assert res["metrics"]["train_solo_s"]["values"] == [t[0] for t in res["times"]["train"]["solo"]]
    assert [r["threads"] for r in res["ranks"]] == [1, 1]  # as Ray gives a main_ppo worker
    times = res["times"]["train"]
    assert len(times["solo"]) == 3 and all(len(t) == 1 and t[0] > 0 for t in times["solo"])
    assert len(times["all"]) == 3 and all(len(t) == 2 and min(t) > 0 for t in times["all"])
    s = res["summary"]["train"]
    assert s["solo_s"] == sorted(t[0] for t in times["solo"])[1]  # the median of three
    assert s["all_s"] == sorted(max(t) for t in times["all"])[1]
