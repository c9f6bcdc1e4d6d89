"""On-policy distillation through `python -m rlpost.trainer.main_ppo` on CPU: a tiny student, a tiny teacher (same
tokenizer, other weights), real Ray, FSDP2 over gloo and the vLLM CPU engine; bad teacher configs stop before Ray."""

import json
import math
import subprocess
import sys

import pytest
from hydra import compose, initialize_config_dir

import rlpost.trainer.config as config_pkg
from rlpost.trainer.main_ppo import run

CONFIG_DIR = str(config_pkg.CONFIG_DIR)
RAY_STARTED = "engine and Ray logs of this run"


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Student, teacher (seed 1, same tokenizer), a model of another tokenizer, and the arith data."""
    from rlpost.utils.tiny_model import build_tiny_model

    root = tmp_path_factory.mktemp("distill")
    subprocess.run([sys.executable, "examples/data_preprocess/arith.py", "--local_dir", str(root / "data"),
                    "--train_size", "8", "--test_size", "2"], check=True, capture_output=True)
    return {"root": root, "student": str(build_tiny_model(root / "student")),
            "teacher": str(build_tiny_model(root / "teacher", seed=1)),
            "other_tokenizer": str(build_tiny_model(root / "other", corpus=["the quick brown fox, 0123456789"] * 200))}


def _args(m, run_dir, *extra: str) -> list[str]:
    return [f"data.train_files={m['root'] / 'data' / 'train.parquet'}", "data.val_files=null",
            "data.train_batch_size=2", "data.max_prompt_length=32", "data.max_response_length=6",
            f"actor_rollout_ref.model.path={m['student']}", "algorithm.adv_estimator=grpo",
            "actor_rollout_ref.rollout.tensor_model_parallel_size=1", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1", "actor_rollout_ref.actor.optim.lr=1e-3",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
            "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2", "distillation.enabled=true",
            "trainer.device=cpu", "trainer.n_gpus_per_node=2", "trainer.total_training_steps=2",
            "trainer.save_freq=-1", "trainer.test_freq=-1", "trainer.logger=[console]", "ray_init.num_cpus=3",
            f"trainer.default_local_dir={run_dir}", *extra]


def _train(args: list[str], run_dir) -> list[dict]:
    proc = subprocess.run([sys.executable, "-m", "rlpost.trainer.main_ppo", *args], capture_output=True, text=True,
                          timeout=560)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "timing_s/step" in r]


@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_verl_distillation_script_downscaled_teacher_in_its_own_pool(models, tmp_path):
    """verl's examples/on_policy_distillation_trainer/run_qwen3_8b_fsdp.sh at 2 steps: k1 as a per-token policy
    gradient (no task reward), clamps, rollout.n=1, the teacher on a pool of its own."""
    rows = _train(_args(models, tmp_path, "actor_rollout_ref.rollout.n=1", "distillation.n_gpus_per_node=1",
                        "distillation.nnodes=1",
                        f"distillation.teacher_models.teacher_model.model_path={models['teacher']}",
                        "distillation.teacher_models.teacher_model.inference.tensor_model_parallel_size=2",
                        "distillation.teacher_models.teacher_model.inference.name=vllm",
                        "distillation.distillation_loss.loss_mode=k1",
                        "distillation.distillation_loss.use_task_rewards=False",
                        "distillation.distillation_loss.use_policy_gradient=True",
                        "distillation.distillation_loss.loss_max_clamp=10.0",
                        "distillation.distillation_loss.log_prob_min_clamp=-10.0"), tmp_path)
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        # two random models of one tokenizer disagree: k3 >= 0, and 0 only where the two log-probs are equal
        assert math.isfinite(r["distillation/teacher_student_kl"])
        assert r["distillation/teacher_student_kl_k3"] > 1e-5, r["distillation/teacher_student_kl_k3"]
        assert r["timing_s/teacher"] > 0
        assert "actor/distillation_loss" not in r  # the divergence is the advantage, not a loss term
        # advantages are minus the clamped k1: within [-10, 10] and negative on average where the student leads
        assert -10.0 <= r["critic/advantages/min"] <= r["critic/advantages/max"] <= 10.0
        # the token-mean advantage is minus the token-mean k1 (no clamp reached), and the update starts on-policy
        assert r["critic/advantages/mean"] == pytest.approx(-r["distillation/teacher_student_kl"], abs=1e-4)
        assert r["actor/pg_loss"] == pytest.approx(r["distillation/teacher_student_kl"], abs=1e-3)


TOPK = ("distillation.distillation_loss.loss_mode=forward_kl_topk", "distillation.distillation_loss.topk=4",
        "distillation.distillation_loss.use_task_rewards=false", "actor_rollout_ref.rollout.n=2",
        "trainer.total_training_steps=1")


@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_topk_self_distillation_has_full_overlap_and_no_divergence(models, tmp_path):
    """forward_kl_topk over the union of the two top-4s, the only signal (no task reward), the teacher a frozen copy
    beside the actor: at step 1 the same weights give the same top-k (overlap 1) and a divergence of ~0."""
    rows = _train(_args(models, tmp_path, *TOPK,
                        f"distillation.teacher_models.teacher_model.model_path={models['student']}"), tmp_path)
    first = rows[0]
    assert first["distillation/topk_overlap"] > 0.9, first["distillation/topk_overlap"]
    # the sampled tokens' log-probs come back too: the same weights, so the teacher-student KL is ~0
    assert abs(first["distillation/teacher_student_kl"]) < 2e-2, first["distillation/teacher_student_kl"]
    assert first["timing_s/teacher"] > 0
    assert 0 <= first["actor/distillation_loss"] < 2e-2, first["actor/distillation_loss"]
    assert 0 < first["distillation/teacher_topk_mass"] <= 1 + 1e-5
    assert first["actor/pg_loss"] == pytest.approx(0.0, abs=1e-6)  # the task advantages are zeroed


def _in_process(args: list[str]) -> int:
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        return run(compose("ppo_trainer", overrides=args))


@pytest.mark.parametrize("extra, message", [
    ([], "config error: distillation.enabled=true, every distillation.teacher_models.<name>.model_path=null"),
    (["distillation.teacher_models.teacher_model.model_path=/no/such/teacher"],
     "error: distillation.teacher_models.teacher_model.model_path='/no/such/teacher' is not a local folder"),
    (["distillation.teacher_models.teacher_model.model_path={other_tokenizer}"],
     "error: distillation.teacher_models.teacher_model.model_path="),
    (["distillation.teacher_models.teacher_model.model_path={teacher}", "distillation.distillation_loss.loss_mode=jsd_topk",
      "distillation.distillation_loss.use_policy_gradient=true"],
     "config error: not supported yet: distillation.distillation_loss.use_policy_gradient=true with "
     "distillation.distillation_loss.loss_mode=jsd_topk"),
    (["distillation.teacher_models.teacher_model.model_path={teacher}", "+distillation.teacher_models.b.model_path={teacher}",
      "+distillation.teacher_models.b.key=rlpost/arith"],
     "config error: distillation.teacher_models.teacher_model.key=null beside teachers with a key"),
])
def test_bad_teacher_configs_stop_before_ray_with_one_line(models, tmp_path, capsys, extra, message):
    extra = [e.format(**{k: v for k, v in models.items() if k != "root"}) for e in extra]
    assert _in_process(_args(models, tmp_path / "run", *extra)) == 2
    err = capsys.readouterr()
    assert err.err.startswith(message), err.err
    assert err.err.strip().count("\n") == 0 and RAY_STARTED not in err.out + err.err
    if models["other_tokenizer"] in "".join(extra):
        assert "its tokenizer differs from the policy's" in err.err
