"""verl's recipe API end to end on CPU (2 worker processes, real Ray, vLLM CPU engine, tiny model, 2 steps):

- a `RayPPOTrainer` subclass overriding one phase, built the verl way (role_worker_mapping of `ray.remote`
  classes, `ResourcePoolManager`, `init_workers()`, `fit()`) with this process as the driver;
- `TaskRunner.run` inside a Ray actor (verl's `main_ppo`), with rollout correction on;
- DAPO dynamic sampling (`algorithm.filter_groups`) through `python -m rlpost.trainer.main_ppo`.
"""

import json
import math
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
import ray
from hydra import compose, initialize_config_dir

from rlpost import keys as K
from rlpost.single_controller.ray import RayWorkerGroup, init_ray
from rlpost.trainer.config import CONFIG_DIR
from rlpost.trainer.main_ppo import TaskRunner
from rlpost.trainer.ppo.launch import load_tokenizer
from rlpost.trainer.ppo.ray_trainer import RayPPOTrainer, ResourcePoolManager, Role
from rlpost.trainer.ppo.reward import load_reward_manager
from rlpost.workers.fsdp_workers import ActorRolloutRefWorker

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]
REPO = Path(__file__).resolve().parents[3]

# Prompts with an even answer always score 0 (their groups are dropped); for the others the score is the
# parity of the response's code points, so two sampled responses disagree about half the time. A batch of
# prompts then rarely yields a full training batch of varied groups: dynamic sampling has to draw more.
PARITY_REWARD = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return float(sum(map(ord, solution_str)) % 2) if int(ground_truth) % 2 else 0.0
'''


@pytest.fixture(scope="module")
def workspace(tmp_path_factory, tiny_model_dir):
    root = tmp_path_factory.mktemp("recipe_api")
    subprocess.run([sys.executable, str(REPO / "examples/data_preprocess/arith.py"), "--local_dir", str(root / "data"),
                    "--train_size", "64", "--test_size", "8"], check=True, capture_output=True)
    (root / "parity.py").write_text(PARITY_REWARD)
    return {"model": tiny_model_dir, "data": root / "data", "root": root}


def overrides(ws, name: str, *extra: str) -> list[str]:
    return [
        f"data.train_files={ws['data'] / 'train.parquet'}", "data.val_files=null", "data.train_batch_size=4",
        "data.max_prompt_length=32", "data.max_response_length=8", f"actor_rollout_ref.model.path={ws['model']}",
        "algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.actor.optim.lr=1e-4", "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
        "trainer.device=cpu", "trainer.n_gpus_per_node=2", "trainer.total_training_steps=2", "trainer.test_freq=-1",
        "trainer.val_before_train=false", "trainer.save_freq=-1", "trainer.logger=[console]", "ray_init.num_cpus=2",
        f"trainer.default_local_dir={ws['root'] / name}", *extra,
    ]


def compose_config(ws, name: str, *extra: str):
    with initialize_config_dir(str(CONFIG_DIR), version_base=None):
        return compose("ppo_trainer", overrides=overrides(ws, name, *extra))


def logged_steps(ws, name: str) -> list[dict]:
    rows = [json.loads(line) for line in (ws["root"] / name / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "timing_s/step" in r]
    assert [r["step"] for r in train] == [1, 2]
    return train


def assert_finite(row: dict, *names: str) -> None:
    for name in names:
        assert name in row, f"{name} missing at step {row['step']}"
        assert math.isfinite(row[name]), (name, row[name])


class ConstantAdvantageTrainer(RayPPOTrainer):
    """A recipe: every valid response token gets advantage 1 (after the regular estimator ran)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.adv_steps: list[int] = []

    def _compute_advantage(self, batch, metrics):
        super()._compute_advantage(batch, metrics)
        batch.batch[K.ADVANTAGES] = batch.batch[K.RESPONSE_MASK].float()
        self.adv_steps.append(self.global_steps)
        metrics["recipe/adv_calls"] = len(self.adv_steps)


def test_recipe_subclass_built_the_verl_way(workspace):
    config = compose_config(workspace, "recipe", f"data.val_files={workspace['data'] / 'test.parquet'}",
                            "trainer.test_freq=2", "actor_rollout_ref.actor.use_kl_loss=true")
    tokenizer = load_tokenizer(config)
    role_worker_mapping = {Role.ActorRollout: ray.remote(ActorRolloutRefWorker),
                           Role.RefPolicy: ray.remote(ActorRolloutRefWorker)}
    mapping = {Role.ActorRollout: "global_pool", Role.RefPolicy: "global_pool"}
    resource_pool_manager = ResourcePoolManager(resource_pool_spec={"global_pool": [2]}, mapping=mapping)
    init_ray(config.ray_init)
    try:
        trainer = ConstantAdvantageTrainer(
            config=config, tokenizer=tokenizer, role_worker_mapping=role_worker_mapping,
            resource_pool_manager=resource_pool_manager, ray_worker_group_cls=RayWorkerGroup,
            reward_fn=load_reward_manager(config, tokenizer, num_examine=0),
            val_reward_fn=load_reward_manager(config, tokenizer, num_examine=1))
        trainer.init_workers()
        last = trainer.fit()
    finally:
        ray.shutdown()
    assert trainer.adv_steps == [1, 2] and trainer.ref_policy_wg is trainer.actor_rollout_wg
    assert last["recipe/adv_calls"] == 2
    for row in logged_steps(workspace, "recipe"):
        assert_finite(row, "actor/pg_loss", "actor/kl_loss", "actor/entropy", "timing_s/ref", "timing_s/update_actor")
        assert row["critic/advantages/min"] == row["critic/advantages/max"] == 1.0
        # PPO loss -ratio * A with A = 1 and ratios near 1: about -1 (GRPO's own advantages average 0)
        assert row["actor/pg_loss"] == pytest.approx(-1.0, abs=0.1)
    assert any(k.startswith("val-core/") for k in last), "validation did not run at the last step"


def test_task_runner_in_a_ray_actor_with_rollout_correction(workspace):
    config = compose_config(
        workspace, "task_runner", "actor_rollout_ref.rollout.calculate_log_probs=true",
        "algorithm.rollout_correction.rollout_is=token", "algorithm.rollout_correction.rollout_rs=token",
        "algorithm.rollout_correction.rollout_is_threshold=2.0", "ray_init.num_cpus=3")
    init_ray(config.ray_init)  # one CPU for the TaskRunner actor, one per worker process
    try:
        runner = ray.remote(num_cpus=1)(TaskRunner).remote()
        last = ray.get(runner.run.remote(config))
    finally:
        ray.shutdown()
    assert last["training/global_step"] == 2
    for row in logged_steps(workspace, "task_runner"):
        assert_finite(row, "rollout_corr/is_weight_mean", "rollout_corr/rejected_frac", "rollout_corr/k3_kl",
                      "training/rollout_probs_diff_max", "timing_s/rollout_correction", "actor/pg_loss")
        assert 0.5 < row["rollout_corr/is_weight_mean"] <= 2.0 and 0.0 <= row["rollout_corr/rejected_frac"] < 0.5


def test_filter_groups_dynamic_sampling_through_main_ppo(workspace):
    """DAPO through main_ppo: dynamic sampling, with the clip_cov loss and seq-mean-token-sum-norm."""
    name = "filter_groups"
    cmd = [sys.executable, "-m", "rlpost.trainer.main_ppo", *overrides(
        workspace, name, "algorithm.filter_groups.enable=true", "algorithm.filter_groups.metric=seq_reward",
        "algorithm.filter_groups.max_num_gen_batches=20", "data.gen_batch_size=4",
        # DAPO-style: one of verl's newer loss modes, clip-higher and Dr.GRPO's aggregation ride along
        "actor_rollout_ref.actor.policy_loss.loss_mode=clip_cov", "actor_rollout_ref.actor.clip_ratio_high=0.28",
        "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum-norm",
        f"custom_reward_function.path={workspace['root'] / 'parity.py'}",
        f"trainer.rollout_data_dir={workspace['root'] / name / 'rollouts'}")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=540, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    rows = logged_steps(workspace, name)
    for row in rows:
        assert_finite(row, "training/num_gen_batches", "training/filter_groups_kept_fraction", "actor/pg_loss",
                      "actor/pg_clipfrac")
        assert 0.0 < row["training/filter_groups_kept_fraction"] <= 1.0
    # about a quarter of the groups vary: keeping 4 of 4 in one generation batch twice is a 1-in-65536 event
    assert sum(r["training/num_gen_batches"] for r in rows) >= 3
    for step in (1, 2):
        dumped = [json.loads(line) for line in (workspace["root"] / name / "rollouts" / f"{step}.jsonl").open()]
        assert len(dumped) == 4 * 2  # exactly train_batch_size groups of rollout.n responses
        by_prompt = defaultdict(list)
        for row in dumped:
            by_prompt[row["prompt"]].append(row["score"])
        assert all(len(set(scores)) > 1 for scores in by_prompt.values()), by_prompt
