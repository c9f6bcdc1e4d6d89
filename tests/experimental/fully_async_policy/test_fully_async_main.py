"""verl's fully-async command line translated to ppo_trainer keys and validated (no Ray): the queue depth,
bound and push interval derived from async_training.*, and the refusals and bad values named at start-up."""

import pytest
from _compose import SMALL, typed_config_of

from rlpost.experimental.fully_async_policy.fully_async_main import translate
from rlpost.trainer.config import ConfigError
from rlpost.trainer.config.async_rules import queue_depth, sync_every

pytestmark = pytest.mark.timeout(120)

RECIPE = ["--config-name=fully_async_ppo_trainer", "data.train_batch_size=0", "data.gen_batch_size=1",
          "rollout.nnodes=1", "rollout.n_gpus_per_node=1", "rollout.n=2"]


def _typed(*args: str):
    small = [a for a in SMALL if not a.startswith("data.train_batch_size")]
    return typed_config_of(*translate([*small, "trainer.n_gpus_per_node=1", *RECIPE, *args]))


@pytest.mark.parametrize("threshold, k, depth", [(0.1, 4, 4), (0.5, 2, 2), (1.0, 1, 1), (0.0, 3, 2)])
def test_freshness_and_sync_interval_set_the_queue(threshold, k, depth):
    # depth = bound = k - 1 + ceil(threshold * k): e.g. 0.1 x 4 -> 3 + 1
    typed = _typed(f"async_training.staleness_threshold={threshold}",
                   f"async_training.trigger_parameter_sync_step={k}", f"trainer.save_freq={k}")
    v1 = typed.trainer.v1
    assert (v1.trainer_mode, queue_depth(typed), sync_every(typed)) == ("separate_async", depth, k)
    assert (v1.sampler.max_off_policy_threshold, v1.sampler.max_off_policy_strategy) == (depth, "wait")
    assert not typed.actor_rollout_ref.hybrid_engine and typed.actor_rollout_ref.rollout.calculate_log_probs
    assert typed.actor_rollout_ref.rollout.n_gpus_per_node == 1 and typed.actor_rollout_ref.rollout.n == 2
    assert typed.algorithm.rollout_correction.bypass_mode  # use_rollout_log_probs
    assert typed.data.train_batch_size == 4  # require_batches 1 x ppo_mini_batch_size 4


def test_partial_rollout_and_proximal_log_probs_map_onto_the_queue_and_the_correction():
    typed = _typed("async_training.staleness_threshold=0.5", "async_training.trigger_parameter_sync_step=2",
                   "trainer.save_freq=2", "async_training.partial_rollout=true",
                   "async_training.compute_prox_log_prob=true")
    assert typed.trainer.v1.separate_async.partial_rollout
    rc = typed.algorithm.rollout_correction
    assert (rc.bypass_mode, rc.rollout_is) == (False, "token")  # decoupled PPO: proximal / behaviour per token
    given = _typed("async_training.compute_prox_log_prob=true", "algorithm.rollout_correction.rollout_is=sequence",
                   "trainer.save_freq=4")
    assert given.algorithm.rollout_correction.rollout_is == "sequence"
    plain = _typed("trainer.save_freq=4")
    assert not plain.trainer.v1.separate_async.partial_rollout


def test_on_policy_and_batch_and_step_counts():
    typed = _typed("async_training.staleness_threshold=0", "async_training.trigger_parameter_sync_step=1",
                   "async_training.require_batches=2", "rollout.total_rollout_steps=40",
                   "async_training.use_rollout_log_probs=false")
    assert (typed.trainer.v1.trainer_mode, typed.trainer.staleness) == ("sync", 0)
    assert typed.data.train_batch_size == 8 and typed.trainer.total_training_steps == 5
    assert not typed.algorithm.rollout_correction.bypass_mode


@pytest.mark.parametrize("arg, expected", [
    ("async_training.use_trainer_do_validate=true", "not supported yet: async_training.use_trainer_do_validate"),
    ("async_training.partial_rollout=true async_training.staleness_threshold=0 "
     "async_training.trigger_parameter_sync_step=1", "nothing is generated ahead of training to pause"),
    ("async_training.trigger_parameter_sync_step=0", "async_training.trigger_parameter_sync_step=0: must be an "
                                                     "integer >= 1; use async_training.trigger_parameter_sync_step=1"),
    ("async_training.staleness_threshold=abc", "use async_training.staleness_threshold=0.1"),
    ("async_training.stalenes_threshold=1", "async_training.stalenes_threshold: no such key"),
    ("rollout.temperature=1", "rollout.temperature: not a key of verl's fully-async rollout group"),
    ("actor_rollout_ref.hybrid_engine=true", "remove the override of actor_rollout_ref.hybrid_engine"),
])
def test_bad_recipe_values_are_named(arg, expected):
    with pytest.raises(ConfigError) as err:
        translate([*RECIPE, *arg.split()])
    assert expected in str(err.value)
