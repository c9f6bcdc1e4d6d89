"""Roles from the config, and the dry-run plan's numbers."""

import pandas as pd
import pytest

from rlpost.trainer.config import ConfigError, need_critic, need_reference_policy, typed_config
from rlpost.trainer.config.plan import dry_run_plan, parquet_rows


@pytest.mark.parametrize("values, critic, ref", [
    ({"algorithm.adv_estimator": "gae", "actor_rollout_ref.actor.use_kl_loss": False}, True, False),
    ({"algorithm.adv_estimator": "grpo"}, False, True),
    ({"algorithm.adv_estimator": "grpo", "critic.enable": True}, True, True),
    ({"algorithm.adv_estimator": "rloo", "actor_rollout_ref.actor.use_kl_loss": False,
      "algorithm.use_kl_in_reward": True}, False, True),
    ({"algorithm.adv_estimator": "remax", "actor_rollout_ref.actor.use_kl_loss": False}, False, False),
])
def test_roles(small_cfg, values, critic, ref):
    cfg = small_cfg(values)
    assert need_critic(cfg) is critic and need_reference_policy(cfg) is ref
    typed = typed_config(cfg)
    assert need_critic(typed) is critic and need_reference_policy(typed) is ref


def test_critic_disabled_with_gae_is_an_error(small_cfg):
    with pytest.raises(ConfigError, match="critic.enable=false with algorithm.adv_estimator=gae"):
        need_critic(small_cfg({"algorithm.adv_estimator": "gae", "critic.enable": False}))


def test_dry_run_plan_numbers(small_cfg, tmp_path):
    files = [tmp_path / "a.parquet", tmp_path / "b.parquet"]
    pd.DataFrame({"prompt": ["x"] * 30}).to_parquet(files[0])
    pd.DataFrame({"prompt": ["y"] * 12}).to_parquet(files[1])
    assert parquet_rows([str(f) for f in files]) == 42
    cfg = small_cfg({"data.train_files": [str(f) for f in files], "trainer.total_epochs": 3,
                     "actor_rollout_ref.actor.ppo_epochs": 2, "critic.enable": True})
    plan = dry_run_plan(typed_config(cfg))
    assert "devices: 2 CPU worker processes" in plan
    assert "per step: 8 prompts -> 32 responses" in plan and "16 responses per device" in plan
    assert "actor: 2 mini-batches per step" in plan and "= 4 optimizer steps per step" in plan
    assert "actor per device: 8 responses per mini-batch = 4 micro-batches of 2 (gradient accumulation 4)" in plan
    assert "roles: actor_rollout, ref, critic" in plan
    assert "total training steps: 15 = 42 rows // data.train_batch_size=8 = 5 steps per epoch x trainer.total_epochs=3" in plan


def test_dry_run_plan_without_data_and_with_fixed_steps(small_cfg):
    plan = dry_run_plan(typed_config(small_cfg({"data.train_files": "/nonexistent.parquet"})))
    assert "total training steps: unknown" in plan and "roles: actor_rollout, ref (adv_estimator=grpo)" in plan
    plan = dry_run_plan(typed_config(small_cfg({"trainer.total_training_steps": 11})))
    assert "total training steps: 11 (trainer.total_training_steps)" in plan
