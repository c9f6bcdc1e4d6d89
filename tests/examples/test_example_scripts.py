"""Example launch scripts stay in step with the config: every override list passes the dry run in-process.

Each `examples/*_trainer/*.sh` is parsed (the lines after `python3 -m rlpost.trainer.main_ppo`), its
`NAME=${NAME:-default}` variables resolved, then composed with Hydra, validated and planned exactly as
`main_ppo` would with `trainer.dry_run=true`. Also: the verl import-path aliases import and score.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from rlpost.trainer.config import CONFIG_DIR, validate_config
from rlpost.trainer.config.convert import to_typed
from rlpost.trainer.config.plan import dry_run_plan

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
ENTRY = "-m rlpost.trainer.main_ppo"
ESTIMATORS = {"grpo_trainer": "grpo", "ppo_trainer": "gae", "rloo_trainer": "rloo",
              "reinforce_plus_plus_trainer": "reinforce_plus_plus", "remax_trainer": "remax"}
TINY = sorted(EXAMPLES.glob("*_trainer/run_tiny_cpu.sh"))
GPU = sorted(EXAMPLES.glob("*_trainer/run_qwen2_5_0_5b_gpu.sh"))
_ASSIGN = re.compile(r"^([A-Z_][A-Z0-9_]*)=\$\{\1:-(.*)\}$")
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}|\$([A-Za-z_][A-Za-z0-9_]*)")


def expand(text: str, env: dict[str, str]) -> str:
    """`${NAME}`, `${NAME:-default}` and `$NAME` replaced from `env` (defaults expanded in turn)."""
    def sub(m: re.Match) -> str:
        name = m.group(1) or m.group(3)
        if name in env:
            return env[name]
        if m.group(2) is not None:
            return expand(m.group(2), env)
        raise KeyError(f"unresolved shell variable ${name} in {text!r}")
    return _VAR.sub(sub, text)


def script_variables(lines: list[str], env: dict[str, str]) -> dict[str, str]:
    """The script's `NAME=${NAME:-default}` lines, resolved in order; entries of `env` win."""
    out = dict(env)
    for line in lines:
        m = _ASSIGN.match(line.strip())
        if m and m.group(1) not in env:
            out[m.group(1)] = expand(m.group(2), out)
    return out


def parse_overrides(script: Path, env: dict[str, str]) -> list[str]:
    """Hydra overrides of the `main_ppo` call in `script`, as the shell would pass them (no `"$@"`)."""
    lines = script.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if ENTRY in line)
    assert lines[start].rstrip().endswith("\\"), f"{script}: overrides must follow, one per line"
    variables = script_variables(lines[:start], env)
    overrides = []
    for line in lines[start + 1:]:
        words = shlex.split(expand(line.rstrip().removesuffix("\\").replace('"$@"', ""), variables))
        assert len(words) <= 1, f"{script}: one override per line, got {line!r}"
        overrides += words
        if not line.rstrip().endswith("\\"):
            break
    assert lines[start + 1 + len(overrides)].strip() == '"$@"', f"{script}: must end with \"$@\""
    return overrides


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


def test_parser_resolves_defaults_quotes_and_env(tmp_path):
    script = tmp_path / "run.sh"
    script.write_text('A=${A:-$HOME/x}\nB=${B:-2}\npython3 -m rlpost.trainer.main_ppo \\\n'
                      '    k.path=$A/m \\\n    k.n=${B} \\\n    k.l=\'["console"]\' \\\n    "$@"\n')
    assert parse_overrides(script, {"HOME": "/h"}) == ["k.path=/h/x/m", "k.n=2", 'k.l=["console"]']
    assert parse_overrides(script, {"HOME": "/h", "B": "8"})[1] == "k.n=8"
    with pytest.raises(KeyError, match=r"\$HOME"):
        parse_overrides(script, {})


@pytest.mark.parametrize("script", TINY, ids=lambda p: p.parent.name)
def test_tiny_cpu_script_dry_run(script, tmp_path):
    env = {"HOME": str(tmp_path), "MODEL_PATH": "/m/tiny", "DATA_DIR": "/d/arith", "CKPT_DIR": str(tmp_path)}
    overrides = parse_overrides(script, env)
    assert REQUIRED <= keys_of(overrides)
    cfg, plan = dry_run(overrides)
    assert cfg.algorithm.adv_estimator == ESTIMATORS[script.parent.name]
    assert cfg.actor_rollout_ref.model.path == "/m/tiny" and cfg.data.train_files == "/d/arith/train.parquet"
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
    env = {"HOME": str(tmp_path)} | ({"N_GPUS": n_gpus} if n_gpus else {})
    overrides = parse_overrides(script, env)
    assert REQUIRED <= keys_of(overrides)
    cfg, plan = dry_run(overrides)
    assert cfg.algorithm.adv_estimator == ESTIMATORS[script.parent.name]
    assert cfg.actor_rollout_ref.model.path == f"{tmp_path}/models/Qwen2.5-0.5B-Instruct"
    assert cfg.trainer.device == "cuda" and cfg.trainer.n_gpus_per_node == int(n_gpus or 1)
    assert f"{int(n_gpus or 1)} GPUs (one worker process each)" in plan
    _check_roles(script.parent.name, overrides, plan)


def _check_roles(algo_dir: str, overrides: list[str], plan: str) -> None:
    """PPO has a critic and no reference; GRPO/REINFORCE++ carry KL in the loss, RLOO/ReMax in the reward."""
    estimator = ESTIMATORS[algo_dir]
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
