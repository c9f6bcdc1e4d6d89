"""Deprecated keys are mapped onto their new names with a ConfigWarning."""

import pytest

from rlpost.trainer.config import ConfigError, ConfigWarning, typed_config, validate_config

ARR = "actor_rollout_ref"


@pytest.mark.parametrize("old, value, new, expected", [
    (f"{ARR}.actor.checkpoint.contents", ["model"], f"{ARR}.actor.checkpoint.save_contents", ["model"]),
    (f"{ARR}.actor.optim.warmup_style", "cosine", f"{ARR}.actor.optim.lr_scheduler", "cosine"),
    ("critic.optim.warmup_style", "cosine", "critic.optim.lr_scheduler", "cosine"),
    ("reward_model.model.fsdp_config.min_num_params", 7, "reward_model.model.fsdp_config.wrap_policy.min_num_params", 7),
])
def test_renamed_key(small_cfg, old, value, new, expected):
    cfg = small_cfg({old: value})
    with pytest.warns(ConfigWarning, match=f"{old} is deprecated"):
        validate_config(cfg)
    assert _get(cfg, new) == expected
    assert _get(cfg, old) == expected  # the old name follows the new one again


@pytest.mark.parametrize("old, new", [
    (f"{ARR}.actor.ppo_micro_batch_size", f"{ARR}.actor.ppo_micro_batch_size_per_gpu"),
    (f"{ARR}.rollout.log_prob_micro_batch_size", f"{ARR}.rollout.log_prob_micro_batch_size_per_gpu"),
    (f"{ARR}.ref.log_prob_micro_batch_size", f"{ARR}.ref.log_prob_micro_batch_size_per_gpu"),
])
def test_global_micro_batch_becomes_per_device(small_cfg, old, new):
    cfg = small_cfg({old: 4})  # 2 devices
    with pytest.warns(ConfigWarning, match=f"{new}=2"):
        validate_config(cfg)
    assert _get(cfg, new) == 2 and _get(cfg, old) is None


def test_global_micro_batch_not_divisible(small_cfg):
    with pytest.raises(ConfigError, match=rf"{ARR}.actor.ppo_micro_batch_size=3 .*use {ARR}.actor.ppo_micro_batch_size_per_gpu="):
        validate_config(small_cfg({f"{ARR}.actor.ppo_micro_batch_size": 3}))


def test_critic_global_micro_batch(small_cfg):
    cfg = small_cfg({"algorithm.adv_estimator": "gae", "critic.ppo_micro_batch_size": 8})
    with pytest.warns(ConfigWarning, match="critic.ppo_micro_batch_size_per_gpu=4"):
        validate_config(cfg)
    assert cfg.critic.ppo_micro_batch_size_per_gpu == 4 and cfg.critic.forward_micro_batch_size_per_gpu == 4


def test_multi_turn_flag_maps_to_enable(small_cfg):
    cfg = small_cfg({f"{ARR}.rollout.multi_turn": False})
    with pytest.warns(ConfigWarning, match="multi_turn.enable=False"):
        validate_config(cfg)
    assert cfg.actor_rollout_ref.rollout.multi_turn.enable is False
    assert cfg.actor_rollout_ref.rollout.multi_turn.tokenization_sanity_check_mode == "strict"
    assert cfg.data.return_raw_chat is False
    cfg = small_cfg({f"{ARR}.rollout.multi_turn": True})
    with pytest.warns(ConfigWarning, match="multi_turn.enable=True"):
        validate_config(cfg)
    assert cfg.actor_rollout_ref.rollout.multi_turn.enable is True
    assert cfg.data.return_raw_chat is True  # follows multi_turn.enable: agent loops need the chat messages


def test_logger_string_and_remove_previous_ckpt(small_cfg):
    cfg = small_cfg({"trainer.logger": "console", "trainer.remove_previous_ckpt_in_save": True})
    with pytest.warns(ConfigWarning, match="max_actor_ckpt_to_keep=1"):
        validate_config(cfg)
    assert list(cfg.trainer.logger) == ["console"]
    assert cfg.trainer.max_actor_ckpt_to_keep == 1 and cfg.trainer.max_critic_ckpt_to_keep == 1


def _get(cfg, key):
    from omegaconf import OmegaConf

    value = OmegaConf.select(cfg, key)
    return OmegaConf.to_container(value) if OmegaConf.is_config(value) else value


@pytest.mark.parametrize("values, message", [
    ({f"{ARR}.actor.ppo_micro_batch_size": 8, f"{ARR}.actor.ppo_micro_batch_size_per_gpu": 1},
     f"{ARR}.actor.ppo_micro_batch_size=8 (deprecated) and {ARR}.actor.ppo_micro_batch_size_per_gpu=1 are both set"),
    ({f"{ARR}.actor.optim.warmup_style": "cosine", f"{ARR}.actor.optim.lr_scheduler": "constant_x"},
     "warmup_style='cosine' (deprecated) and"),
])
def test_deprecated_key_never_overrides_an_explicit_new_one(small_cfg, values, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        validate_config(small_cfg(values))


def test_deprecated_key_agreeing_with_the_new_one_is_fine(small_cfg):
    cfg = small_cfg({f"{ARR}.actor.ppo_micro_batch_size": 4, f"{ARR}.actor.ppo_micro_batch_size_per_gpu": 2})
    with pytest.warns(ConfigWarning, match="deprecated"):
        validate_config(cfg)


@pytest.mark.parametrize("role", ["actor", "ref"])
@pytest.mark.parametrize("key", ["entropy_from_logits_with_chunking", "use_torch_compile", "entropy_checkpointing"])
def test_engine_level_log_prob_knobs_are_the_role_keys(small_cfg, role, key):
    """verl's `<role>.fsdp_config.<knob>` sets the role's knob (the one the log-prob pass reads); unset it
    follows the role's; the critic's, which has no log-prob pass, stays refused."""
    engine_key, role_key = f"actor_rollout_ref.{role}.fsdp_config.{key}", f"actor_rollout_ref.{role}.{key}"
    values = {"actor_rollout_ref.actor.use_kl_loss": True}
    typed = typed_config(validate_config(small_cfg({**values, engine_key: True})))
    assert typed.select(role_key) is True and typed.select(engine_key) is True
    typed = typed_config(validate_config(small_cfg({**values, role_key: True})))
    assert typed.select(engine_key) is True
    with pytest.raises(ConfigError, match=f"not supported yet: critic.model.fsdp_config.{key}=true .*no log-prob pass"):
        validate_config(small_cfg({**values, "critic.enable": True, f"critic.model.fsdp_config.{key}": True}))


def test_entropy_chunk_size_role_and_engine_spellings(small_cfg):
    """verl's `entropy_from_logits_chunk_size` at the role and at the engine level is one setting (an int >= 1);
    the critic's has no effect (no log-prob pass) and says so."""
    typed = typed_config(validate_config(small_cfg({f"{ARR}.actor.fsdp_config.entropy_from_logits_chunk_size": 512,
                                                    f"{ARR}.ref.entropy_from_logits_chunk_size": 256})))
    assert typed.select(f"{ARR}.actor.entropy_from_logits_chunk_size") == 512
    assert typed.select(f"{ARR}.ref.fsdp_config.entropy_from_logits_chunk_size") == 256
    assert typed_config(validate_config(small_cfg({}))).select(f"{ARR}.actor.entropy_from_logits_chunk_size") == 2048
    with pytest.raises(ConfigError, match=f"{ARR}.actor.entropy_from_logits_chunk_size=0: must be an integer >= 1"):
        typed_config(validate_config(small_cfg({f"{ARR}.actor.entropy_from_logits_chunk_size": 0})))
    with pytest.warns(ConfigWarning, match="critic.model.fsdp_config.entropy_from_logits_chunk_size=64 .*no log-prob"):
        typed_config(validate_config(small_cfg({"critic.model.fsdp_config.entropy_from_logits_chunk_size": 64})))
