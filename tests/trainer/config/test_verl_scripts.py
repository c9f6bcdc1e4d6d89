"""verl launch scripts, with `verl` replaced by `rlpost`: each passes the dry run or is refused by name.

The override lists of verl's FSDP example scripts live in `verl_scripts.yaml` beside this file. Each
list goes through the steps of `python -m rlpost.trainer.main_ppo ... trainer.dry_run=true`: the
command-line key check, Hydra composition, validation, the plan. A script either passes without a
config warning, or is refused with `config error: not supported yet: <key>=...` for a feature that
is not built yet.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import yaml

from rlpost.trainer import main_ppo
from rlpost.trainer.config import ConfigError, ConfigWarning
from rlpost.trainer.config.overrides import check_override_keys

SCRIPTS: dict[str, list[str]] = yaml.safe_load((Path(__file__).parent / "verl_scripts.yaml").read_text())

# Scripts refused for a feature not built yet, with the key the refusal names (the first one checked).
REFUSED = {
    "ppo_deepseek7b_llm": "actor_rollout_ref.rollout.quantization",
    "sglang_multiturn_qwen2_5_3b_gsm8k": "actor_rollout_ref.rollout.tensor_model_parallel_size",  # multi-turn, TP 2
    "ppo_deepseek7b_llm_sandbox_fusion": "reward_model.sandbox_fusion.url",
}
# Scripts refused by a value rule, with the start of the message (checked after the feature checks: the
# Qwen3 script's use_liger=true passed its start-up check before its batch sizes were refused).
BREAKS_A_RULE = {
    "grpo_qwen3_1_7b": "actor_rollout_ref.actor.ppo_mini_batch_size=80, data.train_batch_size=1024: "
                       "ppo_mini_batch_size must divide train_batch_size",
}

def dry_run(compose_fn, overrides: list[str], capsys) -> tuple[int, str, str, list[str]]:
    """`main_ppo` on `overrides` plus `trainer.dry_run=true`: (exit status, stdout, stderr, config warnings)."""
    argv = [*overrides, "trainer.dry_run=true"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConfigWarning)
        try:
            check_override_keys(argv)  # main() runs this on the command line before Hydra
        except ConfigError as err:
            return 2, "", f"config error: {err}\n", []
        status = main_ppo.run(compose_fn(overrides=tuple(argv)))
    out = capsys.readouterr()
    return status, out.out, out.err, [str(w.message) for w in caught if issubclass(w.category, ConfigWarning)]


def values(overrides: list[str]) -> dict[str, str]:
    """`{key: value}` of the overrides, the last one winning (a `+` prefix dropped)."""
    return dict(o.lstrip("+").split("=", 1) for o in overrides)


@pytest.mark.parametrize("name", list(SCRIPTS))
def test_verl_script_dry_run(name, compose_fn, capsys):
    overrides = SCRIPTS[name]
    status, out, err, config_warnings = dry_run(compose_fn, overrides, capsys)
    if name in REFUSED:
        assert (status, err.count("\n")) == (2, 1), err
        assert err.startswith(f"config error: not supported yet: {REFUSED[name]}="), err
        return
    if name in BREAKS_A_RULE:
        assert (status, err.count("\n")) == (2, 1), err
        assert err.startswith(f"config error: {BREAKS_A_RULE[name]}"), err
        return
    assert status == 0, err
    # verl's current keys are neither unknown nor deprecated (one-line notices of accepted keys are fine)
    assert not [w for w in config_warnings if " accepted: " not in w], config_warnings
    v = values(overrides)
    devices = int(v["trainer.nnodes"]) * int(v["trainer.n_gpus_per_node"])
    assert f"devices: {devices} GPUs (one worker process each)" in out
    assert f"(adv_estimator={v['algorithm.adv_estimator']})" in out
    assert f"per step: {v['data.train_batch_size']} prompts" in out


def test_expectations_name_scripts_of_the_corpus():
    assert set(REFUSED) | set(BREAKS_A_RULE) <= set(SCRIPTS)
    assert all({"trainer.n_gpus_per_node", "trainer.nnodes"} <= values(ol).keys() for ol in SCRIPTS.values())


@pytest.mark.parametrize("override", ["data.shuffle=False", "data.validation_shuffle=True",
                                      "actor_rollout_ref.model.external_lib=my_pkg"])
def test_current_verl_key_names_are_not_deprecated(override, compose_fn, capsys):
    status, _, err, config_warnings = dry_run(compose_fn, [*SCRIPTS["grpo_qwen2_7b"], override], capsys)
    assert status == 0, err
    assert not config_warnings, config_warnings
