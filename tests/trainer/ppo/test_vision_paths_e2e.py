"""`main_ppo` on a tiny Qwen2.5-VL model, 2 GRPO steps through vLLM on CPU with images in every prompt, on the
packed path (use_remove_padding) under Ulysses SP=2 (the tower trained) and with LoRA on the language model
(the tower frozen, the adapter served by vLLM): finite metrics, a KL loss against the
reference, and the engine's log-probs near the actor's on step 2, after one update and one weight sync."""

import subprocess
import sys

import pytest
from test_vision_e2e import check_two_vl_steps

pytestmark = pytest.mark.timeout(900)

# every run is on the packed path (use_remove_padding=true): Ulysses with the tower trained, LoRA with it frozen
PATHS = {
    "ulysses_sp2": ["actor_rollout_ref.actor.ulysses_sequence_parallel_size=2"],
    "lora": ["actor_rollout_ref.model.lora_rank=8", "actor_rollout_ref.model.lora_alpha=16",
             "actor_rollout_ref.model.target_modules=all-linear",
             "actor_rollout_ref.model.exclude_modules=.*visual.*", "actor_rollout_ref.actor.freeze_vision_tower=true"],
}


@pytest.fixture(scope="module")
def vl25_run(tmp_path_factory):
    from rlpost.utils.tiny_vl_model import build_tiny_vl_model

    root = tmp_path_factory.mktemp("vl25_e2e")
    subprocess.run([sys.executable, "examples/data_preprocess/vision_squares.py", "--local_dir", str(root),
                    "--train_size", "4", "--test_size", "2"], check=True, capture_output=True)
    # a score that differs between any two responses: GRPO advantages are non-zero, the update moves the policy
    (root / "spread_reward.py").write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return (sum(map(ord, solution_str)) % 101) / 100\n")
    return root, str(build_tiny_vl_model(root / "tiny_qwen2_5_vl", arch="qwen2_5_vl"))


def vl_args(root, model: str, run_dir, *extra: str) -> list[str]:
    return [f"data.train_files={root / 'train.parquet'}", f"data.val_files={root / 'test.parquet'}",
            "data.train_batch_size=2", "data.max_prompt_length=48", "data.max_response_length=6",
            f"actor_rollout_ref.model.path={model}", "actor_rollout_ref.model.use_remove_padding=true",
            "algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=2",
            "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
            "actor_rollout_ref.rollout.calculate_log_probs=true", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2", "actor_rollout_ref.actor.optim.lr=1e-3",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
            "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2", "actor_rollout_ref.actor.use_kl_loss=true",
            f"custom_reward_function.path={root / 'spread_reward.py'}",
            "trainer.device=cpu", "trainer.n_gpus_per_node=2", "trainer.total_training_steps=2",
            "trainer.val_before_train=false", "trainer.test_freq=-1", "trainer.save_freq=-1",
            "trainer.logger=[console]", "ray_init.num_cpus=2", f"trainer.default_local_dir={run_dir}", *extra]


@pytest.mark.e2e
@pytest.mark.parametrize("path", sorted(PATHS))
def test_two_grpo_steps_on_tiny_qwen2_5_vl(vl25_run, tmp_path, path):
    root, model = vl25_run
    proc = subprocess.run([sys.executable, "-m", "rlpost.trainer.main_ppo",
                           *vl_args(root, model, tmp_path / "run", *PATHS[path])],
                          capture_output=True, text=True, timeout=850)
    check_two_vl_steps(proc, tmp_path / "run")
