"""Goals E1 and E2 on CPU: the bare value-head loop and rlpost's critic on a tiny model, the LoRA limits, the E2
ratio, and the GPU session script's commands (each parsed by its script's own argument parser)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks import bench_critic, bench_lora, harness, lora_limits, workload
from rlpost import keys

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(30)
def test_clipped_value_loss_by_hand() -> None:
    v, old, ret = torch.tensor([1.0, 0.0, -0.2]), torch.zeros(3), torch.tensor([2.0, 1.0, 0.0])
    # clipped = [0.5, 0, -0.2]; (v-R)^2 = [1, 1, 0.04], (clipped-R)^2 = [2.25, 1, 0.04]: 0.5 x (2.25 + 1 + 0.04).
    assert bench_critic.clipped_value_loss_sum(v, old, ret, 0.5).item() == pytest.approx(1.645)


@pytest.mark.timeout(30)
def test_critic_batch_holds_the_same_tokens_as_the_packed_rows() -> None:
    seqs = [([5, 6], [7, 8, 9]), ([4], [3])]
    batch = bench_critic.critic_batch(seqs, prompt_len=3, cap=4)
    assert batch.batch[keys.INPUT_IDS].tolist() == [[0, 5, 6, 7, 8, 9, 0], [0, 0, 4, 3, 0, 0, 0]]
    assert batch.batch[keys.RESPONSE_MASK].tolist() == [[1, 1, 1, 0], [1, 0, 0, 0]]
    assert batch.batch[keys.POSITION_IDS][1].tolist()[2:4] == [0, 1]
    assert float((batch.batch[keys.RETURNS] * (1 - batch.batch[keys.RESPONSE_MASK])).abs().sum()) == 0.0


@pytest.mark.timeout(30)
def test_critic_summary_pairs_rounds_and_counts_mfu() -> None:
    rounds = [{"bare": {"values_s": 1.0, "update_s": 3.0}, "rlpost": {"values_s": 1.25, "update_s": 3.0}}] * 5
    res = harness.Result("critic", "cmd", 8, env={"date": "2026-12-02", "gpu": "NVIDIA H200"})
    bench_critic.summarize(res, rounds, params=989, tokens=1000)
    assert res.reps == 5 and res.goals["E1"]["reps"] == 5  # the rounds that finished
    assert res.goals["E1"]["value"] == pytest.approx(0.8) and res.goals["E1"]["met"] is False
    assert res.goals["E1_update"]["value"] == pytest.approx(1.0) and res.goals["E1_update"]["met"] is True
    # 6 x 989 x 1000 / 3 s / 989e12 = 2e-9; the values pass 2 x 989 x 1000 / 1.25 s / 989e12 = 1.6e-9.
    assert res.metrics["rlpost_update_mfu"]["value"] == pytest.approx(2e-9)
    assert res.metrics["rlpost_values_mfu"]["value"] == pytest.approx(1.6e-9)
    harness.validate(res.to_dict())
    short = harness.Result("critic", "cmd", 8, env={"date": "2026-12-02", "gpu": "NVIDIA H200"})
    bench_critic.summarize(short, rounds[:3], params=989, tokens=1000)  # cut short: reported, not judged
    assert short.goals["E1"]["reps"] == 3 and short.goals["E1"]["met"] is None
    assert ">= 5" in short.goals["E1"]["reason"]


@pytest.mark.timeout(300)
def test_bench_critic_runs_on_a_tiny_model(tiny_model_dir, tmp_path) -> None:
    model = tmp_path / "m"
    os.symlink(tiny_model_dir, model)  # the value model is saved beside it (<model>_value)
    res = bench_critic.main(["--model-dir", str(model), "--prompts", "1", "--n", "2", "--cap", "16", "--rounds",
                             "2", "--fwd-tokens", "512", "--train-tokens", "256", "--grad-ckpt", "0",
                             "--session", str(tmp_path / "s")])
    data = json.loads((tmp_path / "s" / "critic.json").read_text())
    harness.validate(data)
    assert set(data["goals"]) == {"E1", "E1_update"} and data["goals"]["E1"]["value"] > 0
    assert data["metrics"]["values_gap_before_update"]["value"] < 0.05  # same weights, relative to the values' scale
    assert len(data["rounds"]) == 2 and data["rounds"][1]["order"] == ["bare_fp32", "rlpost", "bare"]
    assert data["metrics"]["update_bare_fp32_over_rlpost"]["value"] > 0  # the third side: rlpost's precision
    assert res.extra["scored_tokens"] == int(workload.gsm8k_shaped(1, 2, 16, 0).caps.sum())  # every response token
    assert (tmp_path / "m_value" / "config.json").exists()


def _limits_result(sum_parts: dict[str, float]) -> dict:
    res = harness.Result("lora_limits", "cmd", 2, env={"date": "2026-12-02", "gpu": "NVIDIA H200"})
    for name, s in sum_parts.items():
        res.timing(f"{name}_s", [s, s])
    res.metric("sum_s", sum(sum_parts.values()), unit="s")
    res.extra["prompt_mean"] = 28.0
    return res.to_dict()


@pytest.mark.timeout(30)
def test_e2_is_the_measured_steps_over_the_sum_of_limits(tmp_path) -> None:
    args = bench_lora.parse_args(["--arch", "7b", "--modes", "lora_adapter", "--limits", "--steps", "3"])
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    rows = [{"step": i, "timing_s/step": s, "timing_s/gen": 2.0, "prompt_length/mean": 28.0}
            for i, s in enumerate((30.0, 10.5, 11.0), 1)]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = bench_lora.read_run("lora_adapter", 0, 100.0, run_dir, tmp_path / "x.log")
    assert run["timing_s/step"]["all"] == [10.5, 11.0]  # step 1 warms up
    limits = _limits_result({"gen": 5.0, "fwd": 1.0, "ref": 1.0, "train": 3.0})  # sum 10 s
    res = bench_lora.build_result(args, [run], {"date": "2026-12-02", "gpu": "NVIDIA H200"}, limits)
    goal = res.goals["E2"]
    assert goal["value"] == pytest.approx((1.05 * 1.1) ** 0.5) and goal["met"] is True  # geomean of 1.05, 1.1
    assert goal["limits_sum_s"] == 10.0 and goal["run_prompt_mean"] == 28.0 and goal["reps"] == 2
    harness.validate(res.to_dict())
    missing = bench_lora.build_result(args, [run], {"date": "2026-12-02", "gpu": "NVIDIA H200"}, None)
    assert missing.goals["E2"]["met"] is None and "lora_limits" in missing.goals["E2"]["reason"]


@pytest.mark.timeout(300)
def test_lora_limits_run_on_a_tiny_model(tiny_model_dir, tmp_path) -> None:
    data = tmp_path / "d"
    subprocess.run([sys.executable, "examples/data_preprocess/times_ten.py", "--local_dir", str(data),
                    "--train_size", "8", "--test_size", "2"], cwd=REPO, check=True, capture_output=True)
    path = lora_limits.main(["--model-dir", tiny_model_dir, "--data", str(data / "train.parquet"), "--prompts",
                             "2", "--n", "2", "--response-len", "8", "--rank", "8", "--reps", "1",
                             "--enforce-eager", "1", "--json-out", str(tmp_path / "ll.json")])
    res = json.loads(path.read_text())
    harness.validate(res)
    parts = [res["metrics"][f"{k}_s"]["value"] for k in lora_limits.PHASES]
    assert all(p > 0 for p in parts) and res["metrics"]["sum_s"]["value"] == pytest.approx(sum(parts))
    assert res["gen_tokens"] == 2 * 2 * 8 and len(res["prompt_tokens"]) == 2
    assert 0 < res["trainable_params"] < res["params"]


@pytest.mark.timeout(120)
def test_gpu_session_dry_run_prints_commands_each_script_accepts(tmp_path) -> None:
    env = {**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable}
    out = subprocess.run(["bash", "benchmarks/gpu_session_e.sh", "--dry-run"], cwd=REPO, env=env, text=True,
                         capture_output=True, check=True).stdout
    lines = {line.split(":", 1)[0].strip(): line.split(": ", 1)[1] for line in out.splitlines() if ": " in line}
    assert lines["session"].startswith(f"{tmp_path}/results/")
    e1, e2 = shlex.split(lines["E1 (limit 180 s)"]), shlex.split(lines["E2 (limit 240 s)"])
    critic = bench_critic.parse_args(e1[e1.index("--model-dir"):])
    assert (critic.prompts, critic.n, critic.rounds) == (64, 8, 8)
    lora = bench_lora.parse_args(e2[2:])
    assert lora.limits and lora.arch == "7b" and lora.timeout == 225 and lora.out.parent == Path(lines["session"])
    inner = [shlex.split(line) for line in out.splitlines() if "benchmarks.lora_limits" in line]
    limits = lora_limits.parse_args(inner[0][3:])
    assert (limits.prompts, limits.response_len, limits.enforce_eager) == (8, 128, 1)
    run = next(line for line in out.splitlines() if "run_qwen2_5_0_5b_gpu.sh" in line)
    assert "lora.merge=false" in run and "FSDP_MIN_NUM_PARAMS=0" in run  # 7B: a unit per decoder layer
    # the run micro-batches by the limits' own token budgets, with their fused head
    assert lora.token_budgets == 1 and "actor_rollout_ref.model.use_fused_kernels=true" in run
    assert f"actor_rollout_ref.actor.ppo_max_token_len_per_gpu={limits.train_tokens}" in run
    assert f"actor_rollout_ref.ref.log_prob_max_token_len_per_gpu={limits.fwd_tokens}" in run
    assert f"actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu={limits.fwd_tokens}" in run
    assert "session_summary" in lines["summary"]
