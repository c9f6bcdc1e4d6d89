"""Goal M1's driver: the MoE shape's parameter counts against transformers' own model, and on CPU the router-replay
run through the GPU example script brought down to the tiny Qwen3-MoE (the trainer's expert-load metrics, the
ratio spread, MFU by active parameters), with the M1 goal issue 49's summary derives from it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_moe  # noqa: E402

from benchmarks import goals_49, harness  # noqa: E402

pytestmark = pytest.mark.timeout(600)


def test_parameter_counts_match_transformers_and_the_published_sizes() -> None:
    import torch
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    cfg = dict(bench_moe.QWEN3_30B_A3B, num_hidden_layers=2)
    with torch.device("meta"):
        model = Qwen3MoeForCausalLM(Qwen3MoeConfig(**cfg))
    assert bench_moe.moe_params(cfg)[0] == sum(p.numel() for p in model.parameters())
    total, active = bench_moe.moe_params(dict(bench_moe.QWEN3_30B_A3B, num_hidden_layers=48))
    # Qwen3-30B-A3B: 30.5 B parameters, 3.3 B activated (that figure counts the embedding, 0.31 B, which the
    # forward only looks up)
    assert total == pytest.approx(30.5e9, rel=0.005)
    assert active + 151936 * 2048 == pytest.approx(3.3e9, rel=0.02)


@pytest.mark.e2e
def test_router_replay_run_on_cpu_and_the_m1_goal(tmp_path: Path) -> None:
    out = tmp_path / "session"
    path = bench_moe.main(["--replay", "r2", "--device", "cpu", "--gpus", "2", "--prompts", "8", "--n", "2",
                           "--cap", "16", "--steps", "2", "--lr", "1e-3", "--timeout", "280", "--out-dir", str(out)])
    data = json.loads(path.read_text())
    harness.validate(data)
    run = data["runs"]["r2"]
    assert (run["rc"], run["steps_done"], run["gpus"]) == (0, 2, 2), run
    rows = [json.loads(line) for line in (out / "moe_r2_metrics.jsonl").read_text().splitlines()]
    for row in rows:  # the trainer's expert load, the replay's changed routes and the ratio spread every step
        assert -1.0 <= row["actor/moe/min_vio/avg"] <= 0.0 <= row["actor/moe/max_vio/avg"]
        assert 0.0 <= row["actor/router_replay/changed_fraction"] <= 1.0 and row["actor/log_ratio_std"] >= 0.0
    # MFU by active parameters, by hand from step 2's logged tokens and update time
    cfg = json.loads((Path("/tmp/m_moe_tiny") / "config.json").read_text())
    active = bench_moe.moe_params(cfg)[1]
    want = 6 * active * rows[1]["perf/total_num_tokens"] / rows[1]["timing_s/update_actor"] / (bench_moe.PEAK * 2)
    assert run["update_mfu_active:median"] == pytest.approx(want)
    goal = goals_49.derive(out).goals["M1"]
    assert goal["value"] == 1.0 and goal["met"] is None and "router replay off did not run" in goal["reason"]
    # with both replay settings the goal is judged, and stays unmet while expert parallelism is not built
    both = {**data, "runs": {"off": {**run, "replay": "off"}, "r2": run}}
    (out / "moe.json").write_text(json.dumps(both))
    goal = goals_49.derive(out).goals["M1"]
    assert goal["met"] is False and "expert parallelism is not built" in goal["reason"]
    assert set(goal["medians"]) == {"off", "r2"} and goal["medians"]["r2"]["actor/log_ratio_std"] >= 0.0
    (out / "moe.json").write_text(json.dumps({**both, "runs": {**both["runs"], "off": {**run, "layers": 48}}}))
    assert "the runs differ" in goals_49.derive(out).goals["M1"]["reason"]  # not the same work: not judged
