"""Ulysses sizes at start-up: they divide the devices and the model's attention heads, need packed rows, and the
batch arithmetic and the dry-run plan count data-parallel ranks as devices / size."""

import json

import pytest

from rlpost.trainer.config import ConfigError, typed_config, validate_config
from rlpost.trainer.config.plan import dry_run_plan

ARR = "actor_rollout_ref"
PACKED = {f"{ARR}.model.use_remove_padding": True}


@pytest.fixture
def model_with_heads(tmp_path):
    """A model folder whose config.json declares `heads` attention heads (all the start-up check reads)."""

    def _make(heads: int) -> str:
        path = tmp_path / f"heads{heads}"
        path.mkdir()
        (path / "config.json").write_text(json.dumps({"model_type": "qwen2", "num_attention_heads": heads}))
        return str(path)

    return _make


def test_size_must_divide_the_devices(config_error):
    msg = config_error({**PACKED, f"{ARR}.actor.ulysses_sequence_parallel_size": 3})
    assert f"{ARR}.actor.ulysses_sequence_parallel_size=3" in msg and "2 devices" in msg
    assert "use one of [1, 2]" in msg


def test_size_must_divide_the_attention_heads(config_error, model_with_heads):
    msg = config_error({**PACKED, "trainer.n_gpus_per_node": 4, f"{ARR}.model.path": model_with_heads(2),
                        f"{ARR}.actor.ulysses_sequence_parallel_size": 4})
    assert f"{ARR}.actor.ulysses_sequence_parallel_size=4" in msg and "with 2 attention heads" in msg
    assert "use one of [1, 2]" in msg


def test_reference_and_critic_sizes_are_checked(config_error, model_with_heads):
    msg = config_error({**PACKED, f"{ARR}.model.path": model_with_heads(2),
                        f"{ARR}.ref.ulysses_sequence_parallel_size": 3})
    assert msg.startswith(f"{ARR}.ref.ulysses_sequence_parallel_size=3")
    msg = config_error({**PACKED, "critic.enable": True, "critic.ulysses_sequence_parallel_size": 2})
    assert "critic.model.use_remove_padding=false" in msg and "use critic.model.use_remove_padding=true" in msg


def test_needs_remove_padding(config_error):
    msg = config_error({f"{ARR}.actor.ulysses_sequence_parallel_size": 2})
    assert f"{ARR}.model.use_remove_padding=false" in msg and f"use {ARR}.model.use_remove_padding=true" in msg


def test_micro_batches_split_the_data_parallel_rank(config_error):
    """4 devices, SP 2: 2 data-parallel ranks of 8 responses per mini-batch (4 prompts x n=4), not 4 ranks of 4."""
    values = {**PACKED, "trainer.n_gpus_per_node": 4, f"{ARR}.actor.ulysses_sequence_parallel_size": 2}
    msg = config_error({**values, f"{ARR}.actor.ppo_micro_batch_size_per_gpu": 3})
    assert "mini-batch per data-parallel rank = " in msg and "= 8" in msg
    assert f"use {ARR}.actor.ppo_micro_batch_size_per_gpu=2" in msg
    msg = config_error({**values, f"{ARR}.actor.use_dynamic_bsz": True, "data.max_prompt_length": 512,
                        "data.max_response_length": 512, f"{ARR}.actor.ppo_max_token_len_per_gpu": 500})
    assert "ppo_max_token_len_per_gpu=500 x ulysses_sequence_parallel_size=2" in msg
    assert f"use {ARR}.actor.ppo_max_token_len_per_gpu=512" in msg  # 512 x 2 holds 1024 tokens


def test_valid_sizes_pass_and_the_plan_shows_them(small_cfg, model_with_heads):
    cfg = small_cfg({**PACKED, "trainer.n_gpus_per_node": 4, f"{ARR}.model.path": model_with_heads(4),
                     f"{ARR}.actor.ulysses_sequence_parallel_size": 4, f"{ARR}.ref.ulysses_sequence_parallel_size": 2})
    plan = dry_run_plan(typed_config(validate_config(cfg)))
    assert "Ulysses sequence parallelism" in plan
    assert "actor 4 (1 data-parallel groups), ref 2 (2 data-parallel groups)" in plan
    # 4 prompts x n=4 = 16 responses per mini-batch, all on the one data-parallel group
    assert "actor per data-parallel group (4 devices share each micro-batch): 16 responses per mini-batch = " \
           "8 micro-batches of 2" in plan


@pytest.mark.parametrize("engine_key, role_key", [
    (f"{ARR}.actor.fsdp_config.ulysses_sequence_parallel_size", f"{ARR}.actor.ulysses_sequence_parallel_size"),
    (f"{ARR}.ref.fsdp_config.ulysses_sequence_parallel_size", f"{ARR}.ref.ulysses_sequence_parallel_size"),
    ("critic.model.fsdp_config.ulysses_sequence_parallel_size", "critic.ulysses_sequence_parallel_size"),
])
def test_engine_level_key_is_the_role_key(small_cfg, engine_key, role_key):
    """verl's `<role>.fsdp_config.ulysses_sequence_parallel_size` sets the role's size; unset it follows it."""
    values = {**PACKED, "critic.enable": True, "critic.model.use_remove_padding": True,
              f"{ARR}.actor.use_kl_loss": True}
    typed = typed_config(validate_config(small_cfg({**values, engine_key: 2})))
    assert typed.select(role_key) == 2 and typed.select(engine_key) == 2
    typed = typed_config(validate_config(small_cfg({**values, role_key: 2})))
    assert typed.select(engine_key) == 2
    with pytest.raises(ConfigError, match=rf"{engine_key}=2 and {role_key}=4 are two spellings of one setting"):
        validate_config(small_cfg({**values, "trainer.n_gpus_per_node": 4, engine_key: 2, role_key: 4}))
