"""Example launch scripts stay in step with the config: every override list passes the dry run in-process.

Each `examples/*_trainer/*.sh` runs under bash with a stand-in `python3` first on PATH that records the
arguments of `python3 -m rlpost.trainer.main_ppo` (the shell resolves `examples/common.sh`, variables,
quotes and `"$@"` itself); the overrides are then composed with Hydra, validated and planned exactly
as `main_ppo` would with `trainer.dry_run=true`. Also: the verl import-path aliases import and score.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pandas as pd
import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from rlpost.trainer.config import CONFIG_DIR, validate_config
from rlpost.trainer.config.convert import to_typed
from rlpost.trainer.config.plan import dry_run_plan

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
ESTIMATORS = {"grpo_trainer": "grpo", "ppo_trainer": "gae", "rloo_trainer": "rloo",
              "reinforce_plus_plus_trainer": "reinforce_plus_plus", "remax_trainer": "remax",
              "on_policy_distillation_trainer": "grpo"}
TINY = sorted(EXAMPLES.glob("*_trainer/run_tiny_cpu.sh"))
GPU = sorted(EXAMPLES.glob("*_trainer/run_qwen2_5_0_5b_gpu.sh"))

# Stands in for python3: records the main_ppo arguments NUL-separated; any other python3 call fails.
FAKE_PYTHON = """#!/bin/sh
[ "$1" = "-m" ] && [ "$2" = "rlpost.trainer.main_ppo" ] || { echo "unexpected: python3 $*" >&2; exit 3; }
shift 2
printf '%s\\0' "$@" > "$ARGV_FILE"
"""


def launch_args(script: Path, env: dict[str, str], tmp_path: Path, *extra: str) -> list[str]:
    """The arguments `script` (run by bash with `extra` appended) passes to `python3 -m rlpost.trainer.main_ppo`."""
    bin_dir, argv_file = tmp_path / "bin", tmp_path / "argv"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "python3").write_text(FAKE_PYTHON)
    (bin_dir / "python3").chmod(0o755)
    full_env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "ARGV_FILE": str(argv_file), **env}
    proc = subprocess.run(["bash", str(script), *extra], env=full_env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    return argv_file.read_text().split("\0")[:-1]


def tiny_env(tmp_path: Path) -> dict[str, str]:
    """HOME, MODEL_PATH and DATA_DIR in `tmp_path`, with the files the tiny scripts would otherwise build."""
    model, data = tmp_path / "tiny", tmp_path / "arith"
    model.mkdir()
    (model / "config.json").write_text("{}")
    data.mkdir()
    pd.DataFrame({"prompt": ["p"] * 64}).to_parquet(data / "train.parquet")
    return {"HOME": str(tmp_path), "MODEL_PATH": str(model), "DATA_DIR": str(data)}


def dry_run(overrides: list[str]) -> tuple[DictConfig, str]:
    """Compose `ppo_trainer` with `overrides`, validate it and return (config, dry-run plan)."""
    with initialize_config_dir(str(CONFIG_DIR), version_base=None):
        cfg = compose("ppo_trainer", overrides=[*overrides, "trainer.dry_run=true"])
    validate_config(cfg)
    return cfg, dry_run_plan(to_typed(cfg))


def keys_of(overrides: list[str]) -> set[str]:
    """The config keys set by `overrides` (`a.b=v` -> `a.b`)."""
    return {o.split("=", 1)[0] for o in overrides}


REQUIRED = {"algorithm.adv_estimator", "data.train_files", "data.val_files", "data.train_batch_size",
            "data.max_prompt_length", "data.max_response_length", "actor_rollout_ref.model.path",
            "actor_rollout_ref.actor.optim.lr", "actor_rollout_ref.actor.ppo_mini_batch_size",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", "actor_rollout_ref.rollout.name",
            "actor_rollout_ref.rollout.n", "actor_rollout_ref.rollout.gpu_memory_utilization",
            "actor_rollout_ref.rollout.tensor_model_parallel_size",
            "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu", "trainer.logger", "trainer.project_name",
            "trainer.experiment_name", "trainer.n_gpus_per_node", "trainer.nnodes", "trainer.save_freq",
            "trainer.test_freq", "trainer.total_epochs"}


def test_every_algorithm_has_both_variants():
    assert {p.parent.name for p in TINY} == set(ESTIMATORS) == {p.parent.name for p in GPU}


def test_shared_overrides_come_first_and_callers_last(tmp_path):
    env = tiny_env(tmp_path)
    args = launch_args(EXAMPLES / "grpo_trainer" / "run_tiny_cpu.sh", env, tmp_path, "data.train_batch_size=8",
                       "trainer.logger=[console,file]")
    assert args[0] == f"data.train_files={env['DATA_DIR']}/train.parquet"  # from examples/common.sh
    assert args[-2:] == ["data.train_batch_size=8", "trainer.logger=[console,file]"]  # "$@", after the script's own
    assert 'trainer.logger=["console"]' in args  # the shell removed the quotes, kept the inner ones
    assert "trainer.default_local_dir=/tmp/rlpost_examples/grpo_tiny_cpu" in args
    assert len(keys_of(args[:-2])) == len(args) - 2  # the script repeats no shared key


@pytest.mark.parametrize("script", TINY, ids=lambda p: p.parent.name)
def test_tiny_cpu_script_dry_run(script, tmp_path):
    env = tiny_env(tmp_path) | {"CKPT_DIR": str(tmp_path / "ckpt")}
    overrides = launch_args(script, env, tmp_path)
    assert REQUIRED <= keys_of(overrides) and len(keys_of(overrides)) == len(overrides)
    cfg, plan = dry_run(overrides)
    assert cfg.algorithm.adv_estimator == ESTIMATORS[script.parent.name]
    assert cfg.actor_rollout_ref.model.path == env["MODEL_PATH"]
    assert cfg.data.train_files == f"{env['DATA_DIR']}/train.parquet"
    assert cfg.trainer.default_local_dir == env["CKPT_DIR"]
    assert (cfg.trainer.device, cfg.trainer.n_gpus_per_node, cfg.trainer.nnodes) == ("cpu", 2, 1)
    assert cfg.actor_rollout_ref.rollout.tensor_model_parallel_size == 1
    assert cfg.actor_rollout_ref.rollout.name == "vllm" and list(cfg.trainer.logger) == ["console"]
    assert 2 <= cfg.trainer.total_training_steps <= 3
    assert cfg.data.train_batch_size * cfg.actor_rollout_ref.rollout.n <= 16  # tiny: a CPU step in seconds
    assert "devices: 2 CPU worker processes" in plan
    assert f"total training steps: {cfg.trainer.total_training_steps}" in plan
    _check_roles(script.parent.name, overrides, plan)


@pytest.mark.parametrize("n_gpus", [None, "8"])
@pytest.mark.parametrize("script", GPU, ids=lambda p: p.parent.name)
def test_gpu_script_dry_run(script, n_gpus, tmp_path):
    env = {"HOME": str(tmp_path)} | ({"N_GPUS": n_gpus, "FSDP_MIN_NUM_PARAMS": "0"} if n_gpus else {})
    overrides = launch_args(script, env, tmp_path)
    assert REQUIRED <= keys_of(overrides) and len(keys_of(overrides)) == len(overrides)
    cfg, plan = dry_run(overrides)
    assert cfg.algorithm.adv_estimator == ESTIMATORS[script.parent.name]
    assert cfg.actor_rollout_ref.model.path == f"{tmp_path}/models/Qwen2.5-0.5B-Instruct"
    assert cfg.trainer.device == "cuda" and cfg.trainer.n_gpus_per_node == int(n_gpus or 1)
    assert f"{int(n_gpus or 1)} GPUs (one worker process each)" in plan
    # the 0.5B model as one FSDP unit unless FSDP_MIN_NUM_PARAMS asks for verl's per-layer units
    arr = cfg.actor_rollout_ref
    units = {arr.actor.fsdp_config.wrap_policy.min_num_params, arr.ref.fsdp_config.wrap_policy.min_num_params}
    assert units == {0 if n_gpus else 10**9}
    # the small-model speed settings follow the one-unit layout; per-layer units keep verl's checkpointing
    fast = not n_gpus
    assert arr.model.enable_gradient_checkpointing is not fast
    assert arr.actor.use_torch_compile is fast and (arr.actor.use_dynamic_bsz or not fast)
    assert arr.actor.fsdp_config.use_no_sync_for_gradient_accumulation is fast
    _check_roles(script.parent.name, overrides, plan)


def _check_roles(algo_dir: str, overrides: list[str], plan: str) -> None:
    """PPO has a critic and no reference; GRPO/REINFORCE++ carry KL in the loss, RLOO/ReMax in the reward."""
    estimator = ESTIMATORS[algo_dir]
    if algo_dir == "on_policy_distillation_trainer":  # the teacher is the signal: no reference, no KL
        assert f"roles: actor_rollout, teacher (adv_estimator={estimator})" in plan
        assert "distillation: k1 reverse KL on the student's samples, coef=1.0; advantage = -divergence per token" \
            in plan
        return
    if algo_dir == "ppo_trainer":
        assert f"roles: actor_rollout, critic (adv_estimator={estimator})" in plan
        assert {"critic.optim.lr", "critic.model.path", "critic.ppo_micro_batch_size_per_gpu"} <= keys_of(overrides)
        return
    assert f"roles: actor_rollout, ref (adv_estimator={estimator})" in plan
    assert not any(o.startswith("critic.") for o in overrides)
    kl_in_loss = algo_dir in ("grpo_trainer", "reinforce_plus_plus_trainer")
    assert f"actor_rollout_ref.actor.use_kl_loss={str(kl_in_loss).lower()}" in overrides
    assert f"algorithm.use_kl_in_reward={str(not kl_in_loss).lower()}" in overrides
    if kl_in_loss:
        assert {"actor_rollout_ref.actor.kl_loss_coef", "actor_rollout_ref.actor.kl_loss_type"} <= keys_of(overrides)


@pytest.mark.parametrize("interaction", [None, "gsm8k"])
def test_multiturn_tiny_cpu_script_dry_run(interaction, tmp_path):
    """examples/multiturn/run_tiny_cpu.sh (data, model and SFT given, so only main_ppo runs): multi-turn GRPO
    with the example tools YAML (and interaction YAML), which load."""
    from rlpost.interactions.utils.interaction_registry import interactions_by_name
    from rlpost.tools.utils.tool_registry import tools_by_name

    data, model = tmp_path / "data", tmp_path / "model"
    data.mkdir()
    model.mkdir()
    pd.DataFrame({"prompt": ["p"] * 64}).to_parquet(data / "train.parquet")
    (model / "config.json").write_text("{}")
    env = {"HOME": str(tmp_path), "DATA_DIR": str(data), "MODEL_PATH": str(model), "WORK_DIR": str(tmp_path / "w"),
           **({"INTERACTION": interaction} if interaction else {})}
    overrides = launch_args(EXAMPLES / "multiturn" / "run_tiny_cpu.sh", env, tmp_path, "trainer.total_training_steps=2")
    assert overrides[-1] == "trainer.total_training_steps=2"
    cfg, plan = dry_run(overrides)
    rollout = cfg.actor_rollout_ref.rollout
    assert rollout.multi_turn.enable and rollout.name == "vllm" and cfg.data.return_raw_chat
    assert list(tools_by_name(rollout.multi_turn.tool_config_path)) == ["calculator"]
    assert cfg.data.tool_config_path == rollout.multi_turn.tool_config_path
    if interaction:
        assert list(interactions_by_name(rollout.multi_turn.interaction_config_path)) == ["gsm8k"]
    else:
        assert rollout.multi_turn.interaction_config_path is None
    assert "devices: 2 CPU worker processes" in plan and "total training steps: 2" in plan
    assert "multi-turn: an agent loop per row (agent_name column, else tool_agent), tools: " in plan


@pytest.mark.parametrize(("env", "engine", "tp", "device"), [
    ({}, "vllm", 1, "cpu"), ({"TP": "2"}, "vllm", 2, "cpu"),
    ({"DEVICE": "gpu"}, "sglang", 2, "cuda"), ({"DEVICE": "gpu", "ENGINE": "vllm"}, "vllm", 2, "cuda")])
def test_multiturn_tp2_script_dry_run(env, engine, tp, device, tmp_path):
    """examples/multiturn/run_gsm8k_multiturn_tp2.sh (verl's TP-2 multi-turn GSM8K script, downscaled; data and
    model given): 2 steps on CPU with TP 1 (or 2), TP 2 on 2 GPUs with SGLang or vLLM; verl's keys kept."""
    data, model = tmp_path / "data", tmp_path / "model"
    data.mkdir()
    model.mkdir()
    pd.DataFrame({"prompt": ["p"] * 64}).to_parquet(data / "train.parquet")
    (model / "config.json").write_text("{}")
    overrides = launch_args(EXAMPLES / "multiturn" / "run_gsm8k_multiturn_tp2.sh",
                            {"HOME": str(tmp_path), "DATA_DIR": str(data), "MODEL_PATH": str(model), **env}, tmp_path)
    verl = {"actor_rollout_ref.actor.kl_loss_type=low_var_kl", "actor_rollout_ref.ref.fsdp_config.param_offload=True",
            "actor_rollout_ref.rollout.multi_turn.format=qwen", "actor_rollout_ref.hybrid_engine=True",
            "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=5", "data.return_raw_chat=True"}
    assert verl <= set(overrides)
    cfg, plan = dry_run(overrides)
    rollout = cfg.actor_rollout_ref.rollout
    assert (rollout.name, rollout.tensor_model_parallel_size, cfg.trainer.device) == (engine, tp, device)
    assert rollout.multi_turn.enable and cfg.trainer.total_training_steps == 2
    assert "multi-turn: an agent loop per row" in plan


def test_multiturn_example_yamls_load_in_verl_shape():
    from rlpost.interactions.utils.interaction_registry import interactions_by_name
    from rlpost.tools.utils.tool_registry import tools_by_name

    config = EXAMPLES / "multiturn" / "config"
    gsm8k = tools_by_name(config / "tool_config" / "gsm8k_tool_config.yaml")
    assert list(gsm8k) == ["calc_gsm8k_reward"] and type(gsm8k["calc_gsm8k_reward"]).__name__ == "Gsm8kTool"
    assert tools_by_name(config / "tool_config" / "calculator_tool_config.yaml")["calculator"].config["timeout"] == 10
    assert list(interactions_by_name(config / "interaction_config" / "gsm8k_interaction_config.yaml")) == ["gsm8k"]


def test_verl_import_path_aliases():
    from rlpost.data import rl_dataset as data_rl_dataset
    from rlpost.reward.score import default_compute_score as real_score
    from rlpost.reward.score import gsm8k as real_gsm8k
    from rlpost.reward.score import math_boxed
    from rlpost.utils.dataset import RLHFDataset as PackageRLHFDataset
    from rlpost.utils.dataset.rl_dataset import RLHFDataset, collate_fn
    from rlpost.utils.reward_score import _default_compute_score, default_compute_score, gsm8k, math

    assert RLHFDataset is data_rl_dataset.RLHFDataset is PackageRLHFDataset
    assert collate_fn is data_rl_dataset.collate_fn
    assert default_compute_score is real_score is _default_compute_score
    assert gsm8k.compute_score is real_gsm8k.compute_score and math.compute_score is math_boxed.compute_score
    assert gsm8k.compute_score("so #### 1,234", "1234") == 1.0
    assert math.compute_score(r"the answer is \boxed{\frac{1}{2}}", r"\frac{1}{2}") == 1.0
    assert default_compute_score("openai/gsm8k", "#### 7", "8") == 0.0


CORRECTION = sorted((EXAMPLES / "rollout_correction").glob("run_*.sh"))


@pytest.mark.parametrize("script", CORRECTION, ids=lambda p: p.stem)
def test_rollout_correction_scripts_dry_run(script, tmp_path):
    """verl's two rollout-correction examples (bypass mode with REINFORCE and sequence weights; PPO clipping with
    two rejection criteria), on GPUs and tiny on CPU: the plan names what the loss does."""
    tiny = script.stem.startswith("run_tiny_cpu")
    env = tiny_env(tmp_path) if tiny else {"HOME": str(tmp_path)}
    overrides = launch_args(script, env, tmp_path)
    assert REQUIRED <= keys_of(overrides) and len(keys_of(overrides)) == len(overrides)
    cfg, plan = dry_run(overrides)
    assert cfg.trainer.device == ("cpu" if tiny else "cuda")
    corr = cfg.algorithm.rollout_correction
    assert corr.bypass_mode and cfg.actor_rollout_ref.rollout.calculate_log_probs
    if script.stem.endswith("multi_rs"):
        assert (corr.rollout_rs, corr.rollout_rs_threshold) == ("token_k1,seq_max_k2", "0.6_1.6,2.5")
        assert ("rejection=token_k1,seq_max_k2 (0.6_1.6,2.5); bypass mode: old policy = the rollout's log-probs, loss "
                "ppo_clip (vanilla clipping; weights unused)") in plan
    else:
        assert cfg.algorithm.adv_estimator == "rloo" and corr.loss_type == "reinforce"
        assert ("rollout correction: importance weights=sequence (cap 2.0, batch-normalised), rejection=off; bypass "
                "mode: old policy = the rollout's log-probs, loss reinforce (-w * A * log pi)") in plan
