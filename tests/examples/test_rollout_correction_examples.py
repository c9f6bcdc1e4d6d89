"""End to end: verl's two rollout-correction examples, scaled down (`examples/rollout_correction/run_tiny_cpu*.sh`),
one step each through main_ppo on CPU (2 worker processes, vLLM CPU). Each launch also carries options a verl user
sets beside them: the RLOO one trains with torch's Adam (amsgrad) and saves the step, the multi-criteria one uses
Dr. GRPO's aggregation with a constant divisor and the catastrophic-token veto. (Their full 2-step runs are in
docs/rollout_correction.md.)"""

import json
import math
import os
import subprocess
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[2]


# A reward that varies with the response (the untrained tiny model scores 0 on arithmetic): the advantages, and so
# the gradients the corrected loss gives, are not all zero.
LENGTH_REWARD = """def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return len(solution_str) / 64.0
"""


def _run(script: str, tmp_path: Path, model: str, *extra: str) -> dict:
    env = {**os.environ, "MODEL_PATH": model, "DATA_DIR": str(tmp_path / "data"), "CKPT_DIR": str(tmp_path / "run")}
    reward = tmp_path / "length_reward.py"
    reward.write_text(LENGTH_REWARD)
    proc = subprocess.run(["bash", str(REPO / "examples/rollout_correction" / script), "trainer.logger=[console,file]",
                           "trainer.total_training_steps=1", "trainer.val_before_train=false", "trainer.test_freq=-1",
                           f"custom_reward_function.path={reward}", *extra],
                          env=env, cwd=REPO, capture_output=True, text=True, timeout=540)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "timing_s/step" in r]
    assert [r["step"] for r in train] == [1]
    row = train[0]
    for key in ("actor/pg_loss", "actor/grad_norm", "actor/ppo_kl", "rollout_corr/rejected_frac"):
        assert math.isfinite(row[key]), (key, row[key])
    assert row["critic/score/max"] > row["critic/score/min"] and row["actor/grad_norm"] > 0
    # bypass mode: the rollout's log-probs are the old policy, and at step 1 the policy is the rollout's
    assert abs(row["actor/ppo_kl"]) < 1e-3
    return row


def test_rloo_bypass_reinforce_with_sequence_weights_and_adam(tmp_path, tiny_model_dir):
    row = _run("run_tiny_cpu.sh", tmp_path, tiny_model_dir, "actor_rollout_ref.actor.optim.optimizer=Adam",
               "actor_rollout_ref.actor.optim.override_optimizer_config={amsgrad:true}", "trainer.save_freq=1")
    assert row["rollout_corr/rejected_frac"] == 0.0  # no rejection configured
    assert row["actor/pg_clipfrac"] == 0.0 and row["actor/pg_loss"] != 0.0  # REINFORCE does not clip
    shard = torch.load(tmp_path / "run" / "global_step_1" / "actor" / "optim_world_size_2_rank_0.pt",
                       weights_only=False)
    states = list(shard["state"].values())
    assert states and all("max_exp_avg_sq" in s for s in states)  # amsgrad's state: Adam with the override ran


def test_grpo_bypass_ppo_clip_with_two_criteria_dr_grpo_divisor_and_veto(tmp_path, tiny_model_dir):
    row = _run("run_tiny_cpu_multi_rs.sh", tmp_path, tiny_model_dir,
               "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum-norm",
               "actor_rollout_ref.actor.loss_scale_factor=16",
               "algorithm.rollout_correction.rollout_token_veto_threshold=1e-4")
    assert 0.0 <= row["rollout_corr/rejected_frac"] <= 1.0
