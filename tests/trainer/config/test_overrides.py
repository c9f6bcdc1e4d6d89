"""Command-line keys checked before Hydra: a typo gets the nearest key, valid forms pass through."""

import subprocess
import sys

import pytest

from rlpost.trainer.config import ConfigError
from rlpost.trainer.config.overrides import check_override_keys

ARR = "actor_rollout_ref"


def test_typo_names_the_nearest_key():
    with pytest.raises(ConfigError) as err:
        check_override_keys([f"{ARR}.actor.clip_ratoi=0.3"])
    assert f"did you mean '{ARR}.actor.clip_ratio'? use {ARR}.actor.clip_ratio=0.3" in str(err.value)


@pytest.mark.parametrize("key, expected", [
    ("data.train_bach_size", "data.train_batch_size"),          # a sibling's misspelling
    (f"{ARR}.actr.optim.lr", f"{ARR}.actor.optim.lr"),          # a misspelt group
    ("data.foo", None),                                        # nothing like it: no guess at 'data' or 'data.shuffle'
    (f"{ARR}.model_path", f"{ARR}.model.path"),                # the leaf, not the group
    (f"{ARR}.ref.sync_ref_model", None),                       # no sibling is close: no guess at 'ref.model'
])
def test_closest_key_prefers_siblings_and_never_guesses_wildly(key, expected):
    from rlpost.config.convert import _leaf_keys
    from rlpost.trainer.config.errors import closest_key

    assert closest_key(key, _leaf_keys()) == expected


@pytest.mark.parametrize("arg, hint", [
    (f"{ARR}.model_path=/m", f"did you mean '{ARR}.model.path'? use {ARR}.model.path=/m."),
    ("reward_model.sandbox_fusion_url=http://x",
     "did you mean 'reward_model.sandbox_fusion.url'? use reward_model.sandbox_fusion.url=http://x."),
    (f"{ARR}.ref.sync_ref_model=True", "check the spelling against `--cfg job`."),
])
def test_a_scalar_value_is_never_advised_onto_a_group(arg, hint):
    """`reward_model.model_path=/m` once got "use reward_model.model=/m": a group set to a string."""
    with pytest.raises(ConfigError) as err:
        check_override_keys([arg])
    assert str(err.value).endswith(hint), err.value


@pytest.mark.timeout(60)
def test_added_unknown_key_is_named_without_a_wrong_suggestion():
    from _compose import compose_config

    with pytest.raises(ConfigError, match=r"unknown key 'data.foo' \(value 1\): it is not a config key; remove it"):
        compose_config("+data.foo=1")


@pytest.mark.parametrize("arg", [
    f"{ARR}.actor.clip_ratio=0.3",                          # a key of the default config
    f"{ARR}.rollout.engine_kwargs.vllm.swap_space=4",        # a child of a free-form map: Hydra's business
    f"+{ARR}.rollout.engine_kwargs.vllm.swap_space=4",       # explicit add
    "algorithm.filter_groups.enable=true",                  # verl's newer keys exist
    f"{ARR}.actor.checkpoint.save_contents=[model]",
    "hydra.run.dir=/tmp/x",
])
def test_valid_forms_pass(arg):
    check_override_keys([arg])


def test_user_config_name_defers_to_hydra():
    check_override_keys(["--config-name=my_exp", "my_recipe.key=1"])


@pytest.mark.timeout(120)
def test_main_ppo_typo_exits_2_with_one_line():
    out = subprocess.run([sys.executable, "-m", "rlpost.trainer.main_ppo", "trainer.n_gpus_per_nodes=2"],
                         capture_output=True, text=True, timeout=110)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "config error: unknown key 'trainer.n_gpus_per_nodes' (command line: trainer.n_gpus_per_nodes=2): it is not "
        "a config key; did you mean 'trainer.n_gpus_per_node'? use trainer.n_gpus_per_node=2."]


def test_user_yaml_syntax_error_names_file_and_line(tmp_path):
    from rlpost.trainer.config.overrides import check_user_yaml

    (tmp_path / "exp.yaml").write_text("defaults: [ppo_trainer, _self_]\ndata:\n  train_batch_size: 8\n bad: [1\n")
    with pytest.raises(ConfigError) as err:
        check_user_yaml([f"--config-path={tmp_path}", "--config-name", "exp"])
    assert str(err.value).startswith(f"{tmp_path / 'exp.yaml'}: line ") and "YAML syntax error" in str(err.value)
