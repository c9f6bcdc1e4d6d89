"""End to end: verl's sandbox-fusion PPO script (examples/ppo_trainer/run_deepseek7b_llm_sandbox_fusion.sh, its
overrides as tests/trainer/config/verl_scripts.yaml keeps them), downscaled to a tiny model, 2 CPU processes and 2
steps, with `reward_model.sandbox_fusion.url=local` and synthetic code data (codecontests-style test cases)."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[3]
SCRIPT = yaml.safe_load((REPO / "tests/trainer/config/verl_scripts.yaml").read_text())[
    "ppo_deepseek7b_llm_sandbox_fusion"]


def downscaled(data: Path, model: str, out: Path) -> list[str]:
    """The script's overrides with the sizes, paths and devices of this machine (every other key as verl set it)."""
    replace = {
        "reward_model.sandbox_fusion.url": "local", "reward_model.sandbox_fusion.max_concurrent": "2",
        "data.train_files": str(data / "train.parquet"), "data.val_files": str(data / "test.parquet"),
        "data.train_batch_size": "4", "data.max_prompt_length": "128", "data.max_response_length": "16",
        "actor_rollout_ref.model.path": model, "critic.model.path": model,
        "actor_rollout_ref.actor.ppo_mini_batch_size": "4", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": "2",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": "4",
        "actor_rollout_ref.rollout.tensor_model_parallel_size": "1",
        "actor_rollout_ref.rollout.gpu_memory_utilization": "0.3", "critic.ppo_micro_batch_size_per_gpu": "2",
        "trainer.logger": "[console]", "trainer.n_gpus_per_node": "2", "trainer.save_freq": "-1",
        "trainer.test_freq": "-1", "trainer.total_epochs": "1",
    }
    overrides = []
    for item in SCRIPT:
        key = item.split("=", 1)[0]
        overrides.append(f"{key}={replace.pop(key)}" if key in replace else item)
    assert not replace, f"keys no longer in the script: {sorted(replace)}"
    return overrides + ["trainer.device=cpu", "trainer.total_training_steps=2", "ray_init.num_cpus=2", "trainer.val_before_train=false",
                        "actor_rollout_ref.model.enable_gradient_checkpointing=False",
                        "critic.model.enable_gradient_checkpointing=False", f"trainer.default_local_dir={out}"]


def test_verl_sandbox_fusion_script_downscaled(tmp_path, tiny_model_dir):
    data = tmp_path / "code"
    subprocess.run([sys.executable, "examples/data_preprocess/code_synth.py", "--local_dir", str(data),
                    "--train_size", "16", "--test_size", "4"], check=True, capture_output=True, cwd=REPO)
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "rlpost.trainer.main_ppo",
                           *downscaled(data, tiny_model_dir, out)], capture_output=True, text=True, timeout=540,
                          cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert "[rlpost] code sandbox: http://127.0.0.1:" in proc.stdout
    pid = int(proc.stdout.split("[rlpost] code sandbox: ")[1].split("(pid ")[1].split(")")[0])
    assert not Path(f"/proc/{pid}").exists(), "the service stopped with the run"
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "timing_s/step" in r]
    assert [r["step"] for r in train] == [1, 2]
    for row in train:
        # an untrained tiny model writes no code block: every sample scores 0 as no_code, counted per batch
        assert row["reward/sandbox/no_code_count"] == 4 and row["reward/sandbox/pass_rate"] == 0.0
        assert all(math.isfinite(row[k]) for k in ("critic/vf_loss", "actor/pg_loss", "critic/score/mean"))
