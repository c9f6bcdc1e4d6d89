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
from rlpost.trainer.config.overrides import check_override_keys, plus_on_existing_keys

HERE = Path(__file__).parent
# verl's older example scripts (volcengine/verl) and its current ones (verl-project/verl, 2026-11)
SCRIPTS: dict[str, list[str]] = {**yaml.safe_load((HERE / "verl_scripts.yaml").read_text()),
                                 **yaml.safe_load((HERE / "verl_project_scripts.yaml").read_text())}

# Scripts refused for a feature not built yet, with the key the refusal names (the first one checked).
REFUSED = {
    "ppo_deepseek7b_llm": "actor_rollout_ref.rollout.quantization",
    # the current corpus
    "grpo_qwen3_5_2b_openr1_fsdp": "data.image_patch_size",  # images and videos
    "grpo_qwen3_5_2b_video_fsdp": "data.image_patch_size",
    "prefix_grouper_qwen3_8b_fsdp": "actor_rollout_ref.actor.use_prefix_grouper",
    "sglang_multiturn_qwen2_5_3b_gsm8k_tool_agent_mlflow_fsdp": "actor_rollout_ref.rollout.trace.backend",
    "tuning_lora_qwen2_5_vl_7b_fsdp": "actor_rollout_ref.model.modules_to_save",
}
# Scripts of algorithms verl added that rlpost does not have, whose keys are not rlpost's yet: stopped with the
# start of this message (an unknown key, or a value of a shape rlpost's key does not take).
NOT_BUILT = {
}
# Scripts refused by a value rule, with the start of the message (checked after the feature checks: the
# Qwen3 script's use_liger=true passed its start-up check before its batch sizes were refused).
BREAKS_A_RULE = {
    # over-sampling with multi-turn is built; rlpost trains on train_batch_size whole finished groups, so the
    # generation batch must hold more prompts (verl pads the aborted responses instead)
    "sglang_multiturn_qwen2_5_3b_gsm8k_multiturn_fsdp": "actor_rollout_ref.rollout.over_sample_rate=0.1, "
                                                        "data.gen_batch_size=",
    "sglang_multiturn_qwen3_4b_gsm8k_multiturn_fsdp": "actor_rollout_ref.rollout.over_sample_rate=0.1, "
                                                      "data.gen_batch_size=",
    # multi-turn with TP 2 is built; its micro-batch of 40 does not divide the 512 rows per rank and mini-batch
    "sglang_multiturn_qwen2_5_3b_gsm8k": "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=40, mini-batch per "
                                         "data-parallel rank",
    "grpo_qwen3_1_7b": "actor_rollout_ref.actor.ppo_mini_batch_size=80, data.train_batch_size=1024: "
                       "ppo_mini_batch_size must divide train_batch_size",
    # its data.mm_processor_kwargs are built; its dynamic micro-batch is smaller than one full-length sample
    # reinforce in bypass mode is built; at verl's default 8 GPUs and rollout.n=1 its mini-batch of 32 is 4 rows
    # per rank, fewer than its micro-batch of 8 (verl's own check, mini-batch % micro-batch == 0, refuses it too)
    "rollout_correction_qwen2_5_7b_fsdp": "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8, mini-batch per "
                                          "data-parallel rank",
    "gspo_qwen3_omni_thinker_fsdp2": "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=16384 x "
                                     "ulysses_sequence_parallel_size=1",
}

# Scripts whose only stored `--config-name` YAML is an older verl's: the deprecation notice of its old key is due.
OLD_KEYS = {
    "sglang_multiturn_geo3k_qwen2_5_3b_geo3k_multiturn_fsdp": "actor_rollout_ref.rollout.multi_turn.max_turns is "
                                                              "deprecated",
}


def dry_run(compose_fn, overrides: list[str], capsys) -> tuple[int, str, str, list[str]]:
    """`main_ppo` on `overrides` plus `trainer.dry_run=true`: (exit status, stdout, stderr, config warnings)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConfigWarning)
        argv = plus_on_existing_keys([*overrides, "trainer.dry_run=true"])  # as main() does before Hydra
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
    if name in BREAKS_A_RULE or name in NOT_BUILT:
        assert (status, err.count("\n")) == (2, 1), err
        assert err.startswith(f"config error: {BREAKS_A_RULE.get(name) or NOT_BUILT[name]}"), err
        return
    assert status == 0, err
    # verl's current keys are neither unknown nor deprecated (one-line notices of accepted keys are fine, and a '+'
    # that rlpost drops because it has the key verl's script adds)
    assert not [w for w in config_warnings if " accepted: " not in w and "(add a key) is dropped" not in w
                and not (name in OLD_KEYS and w.startswith(OLD_KEYS[name]))], config_warnings
    v = values(overrides)
    devices = int(v["trainer.nnodes"]) * int(v["trainer.n_gpus_per_node"])
    assert f"devices: {devices} GPUs (one worker process each)" in out
    assert f"(adv_estimator={v['algorithm.adv_estimator']})" in out
    assert f"per step: {v['data.train_batch_size']} prompts" in out


def test_expectations_name_scripts_of_the_corpus():
    assert set(REFUSED) | set(BREAKS_A_RULE) | set(NOT_BUILT) | set(OLD_KEYS) <= set(SCRIPTS)
    stopped = set(REFUSED) | set(BREAKS_A_RULE) | set(NOT_BUILT)  # the dry run's device line is checked on the rest
    assert all({"trainer.n_gpus_per_node", "trainer.nnodes"} <= values(ol).keys()
               for name, ol in SCRIPTS.items() if name not in stopped)


@pytest.mark.parametrize("override", ["data.shuffle=False", "data.validation_shuffle=True",
                                      "actor_rollout_ref.model.external_lib=my_pkg"])
def test_current_verl_key_names_are_not_deprecated(override, compose_fn, capsys):
    status, _, err, config_warnings = dry_run(compose_fn, [*SCRIPTS["grpo_qwen2_7b"], override], capsys)
    assert status == 0, err
    assert not config_warnings, config_warnings
