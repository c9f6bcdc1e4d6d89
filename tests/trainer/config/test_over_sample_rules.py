"""Start-up rules of `actor_rollout_ref.rollout.over_sample_rate`: accepted with async rollouts and a generation
batch whose kept share holds a training batch; otherwise one message naming the keys and a value that works."""

import pytest

from rlpost.trainer.config import ConfigError, validate_config

pytestmark = pytest.mark.timeout(60)

ARR = "actor_rollout_ref"
OS = f"{ARR}.rollout.over_sample_rate"


def test_accepted_with_async_rollouts_and_a_big_enough_generation_batch(small_cfg):
    cfg = validate_config(small_cfg({OS: 0.2, f"{ARR}.rollout.mode": "async", "data.gen_batch_size": 10}))
    assert cfg.actor_rollout_ref.rollout.over_sample_rate == 0.2 and cfg.data.gen_batch_size == 10


def test_accepted_with_multi_turn_rollouts(small_cfg):
    """verl's multi-turn scripts set it (their slowest trajectories are cancelled whole)."""
    cfg = validate_config(small_cfg({OS: 0.1, f"{ARR}.rollout.mode": "async", "data.gen_batch_size": 9,
                                     f"{ARR}.rollout.multi_turn.enable": True, "data.return_raw_chat": True}))
    assert cfg.actor_rollout_ref.rollout.multi_turn.enable and cfg.actor_rollout_ref.rollout.over_sample_rate == 0.1


@pytest.mark.parametrize("overrides, message", [
    ({OS: 0.2, f"{ARR}.rollout.mode": "async"},  # train_batch_size 8: ceil(8 / 0.8) = 10
     f"{OS}=0.2, data.gen_batch_size=8, data.train_batch_size=8: a generation batch of gen_batch_size prompts "
     "keeps ceil((1 - over_sample_rate) x gen_batch_size) groups, which must hold a training batch; use "
     "data.gen_batch_size=10."),
    ({OS: 0.2, "data.gen_batch_size": 10},
     f"{OS}=0.2, {ARR}.rollout.mode=sync: aborting the slowest requests needs each prompt to be its own engine "
     f"request; use {ARR}.rollout.mode=async."),
    ({OS: 1.0}, f"{OS}=1.0: must be in [0, 1)"),
])
def test_refused_with_one_message(small_cfg, overrides, message):
    with pytest.raises(ConfigError) as err:
        validate_config(small_cfg(overrides))
    assert str(err.value).startswith(message), str(err.value)
