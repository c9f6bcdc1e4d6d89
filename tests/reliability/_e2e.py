"""The short CPU GRPO run the reliability e2e tests launch through `main_ppo` (2 workers, tiny model)."""

import subprocess
import sys


def make_data(root) -> None:
    """arith train (8 rows) / test (2 rows) parquet files under `root / "data"`."""
    subprocess.run([sys.executable, "examples/data_preprocess/arith.py", "--local_dir", str(root / "data"),
                    "--train_size", "8", "--test_size", "2"], check=True, capture_output=True)


def command(root, model, run_dir, *extra: str) -> list[str]:
    """`python -m rlpost.trainer.main_ppo ...`: 2 GRPO steps on `root / "data"`, a checkpoint every step."""
    return [
        sys.executable, "-m", "rlpost.trainer.main_ppo",
        f"data.train_files={root / 'data' / 'train.parquet'}", "data.val_files=null", "data.train_batch_size=2",
        "data.max_prompt_length=32", "data.max_response_length=6", f"actor_rollout_ref.model.path={model}",
        "algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.actor.optim.lr=1e-3", "actor_rollout_ref.actor.entropy_coeff=0.01",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
        "trainer.device=cpu", "trainer.n_gpus_per_node=2", "trainer.total_training_steps=2",
        "trainer.save_freq=1", "trainer.test_freq=-1", "trainer.logger=[console]", "ray_init.num_cpus=2",
        f"trainer.default_local_dir={run_dir}", *extra,
    ]


def run(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=400)
