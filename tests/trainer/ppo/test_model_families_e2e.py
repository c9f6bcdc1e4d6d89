"""`main_ppo` on today's model families: 2 GRPO steps with remove-padding on a tiny Qwen3-MoE through vLLM on CPU
(router replay R2 on) and on a tiny Qwen3-Next (hybrid linear attention) through the HF engine, both logging the MoE
load metrics; the combinations that cannot be right
stop before Ray with the key named (exit status 2)."""

import json
import subprocess
import sys

import pytest
from hydra import compose, initialize_config_dir

import rlpost.trainer.config as config_pkg
from rlpost.trainer.main_ppo import run

pytestmark = pytest.mark.timeout(600)

CONFIG_DIR = config_pkg.__path__[0]
RAY_STARTED = "engine and Ray logs of this run"


@pytest.fixture(scope="module")
def families(tmp_path_factory):
    """{arch: tiny model folder} for qwen3_moe, qwen3_next and (dense) llama, and the arith data folder."""
    from rlpost.utils.tiny_model import build_tiny_model

    root = tmp_path_factory.mktemp("families")
    subprocess.run([sys.executable, "examples/data_preprocess/arith.py", "--local_dir", str(root / "data"),
                    "--train_size", "8", "--test_size", "2"], check=True, capture_output=True)
    models = {a: str(build_tiny_model(root / a, arch=a)) for a in ("qwen3_moe", "qwen3_next", "llama")}
    return root, models


def _args(root, model: str, run_dir, *extra: str) -> list[str]:
    return [f"data.train_files={root / 'data' / 'train.parquet'}", "data.val_files=null", "data.train_batch_size=2",
            "data.max_prompt_length=32", "data.max_response_length=6", f"actor_rollout_ref.model.path={model}",
            "actor_rollout_ref.model.use_remove_padding=true", "algorithm.adv_estimator=grpo",
            "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
            "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
            "actor_rollout_ref.actor.optim.lr=1e-3", "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
            "trainer.device=cpu", "trainer.n_gpus_per_node=2", "trainer.total_training_steps=2",
            "trainer.save_freq=-1", "trainer.test_freq=-1", "trainer.logger=[console]", "ray_init.num_cpus=2",
            f"trainer.default_local_dir={run_dir}", *extra]


def _main_ppo(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rlpost.trainer.main_ppo", *args], capture_output=True, text=True,
                          timeout=500)


def _in_process(args: list[str]) -> int:
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        return run(compose("ppo_trainer", overrides=args))


@pytest.mark.e2e
def test_two_grpo_steps_on_qwen3_moe_with_vllm_and_on_qwen3_next_with_hf(families, tmp_path):
    root, models = families
    load = "actor_rollout_ref.rollout.moe_load_balance_metrics_interval=1"
    runs = {"qwen3_moe": _main_ppo(_args(root, models["qwen3_moe"], tmp_path / "moe",
                                         "actor_rollout_ref.actor.router_replay.mode=R2", load)),
            "qwen3_next": _main_ppo(_args(root, models["qwen3_next"], tmp_path / "next",
                                          "actor_rollout_ref.rollout.name=hf", load))}
    for arch, proc in runs.items():
        assert proc.returncode == 0, f"{arch}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        out = proc.stdout + proc.stderr
        assert "step 2 |" in out, (arch, out[-2000:])
    rows = [json.loads(line) for line in (tmp_path / "moe" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "timing_s/step" in r]
    assert len(train) == 2
    for row in train:  # the update replayed the routing its old-log-prob pass recorded
        assert 0.0 <= row["actor/router_replay/changed_fraction"] < 1.0
    for arch in ("moe", "next"):  # the load metrics of each step; qwen3_next's recorder ran without replay
        rows = [json.loads(line) for line in (tmp_path / arch / "metrics.jsonl").read_text().splitlines()]
        train = [r for r in rows if "timing_s/step" in r]
        assert len(train) == 2
        for row in train:
            assert -1.0 <= row["actor/moe/min_vio/avg"] <= 0.0 <= row["actor/moe/max_vio/avg"], (arch, row)
            assert row["actor/moe/avg_vio/max"] >= row["actor/moe/avg_vio/avg"] >= 0.0
            assert "actor/moe/max_vio/layer_0" in row
            assert (arch == "moe") == ("actor/router_replay/changed_fraction" in row), (arch, sorted(row))


@pytest.mark.parametrize("arch, extra, key", [
    ("qwen3_moe", ["actor_rollout_ref.actor.router_replay.mode=R2", "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2"],
     "config error: actor_rollout_ref.actor.router_replay.mode=R2, actor_rollout_ref.actor.ulysses_sequence_parallel_size=2"),
    ("qwen3_next", [], "error: actor_rollout_ref.rollout.name=vllm on trainer.device=cpu with a qwen3_next model"),
    ("qwen3_next", ["actor_rollout_ref.rollout.name=hf", "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2"],
     "error: actor_rollout_ref.actor.ulysses_sequence_parallel_size=2: a qwen3_next model has linear-attention"),
    ("qwen3_next", ["actor_rollout_ref.rollout.name=hf", "actor_rollout_ref.actor.router_replay.mode=R2",
                    "actor_rollout_ref.model.path={llama}"],
     "error: actor_rollout_ref.actor.router_replay.mode=R2: a llama model is dense"),
    ("qwen3_next", ["actor_rollout_ref.rollout.name=hf", "actor_rollout_ref.rollout.moe_load_balance_metrics_interval=2",
                    "actor_rollout_ref.model.path={llama}"],
     "error: actor_rollout_ref.rollout.moe_load_balance_metrics_interval=2: a llama model is dense"),
])
def test_wrong_combinations_stop_before_ray_naming_the_key(families, tmp_path, capsys, arch, extra, key):
    root, models = families
    extra = [e.format(**models) for e in extra]
    assert _in_process(_args(root, models[arch], tmp_path / "run", *extra)) == 2
    err = capsys.readouterr()
    assert err.err.startswith(key), err.err
    assert "actor_rollout_ref." in err.err.split(":", 2)[-1] and RAY_STARTED not in err.out + err.err
