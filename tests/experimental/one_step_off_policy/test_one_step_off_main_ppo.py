"""verl's one-step-off command line translated to ppo_trainer keys and validated (no Ray)."""

import pytest
from _compose import SMALL, typed_config_of

from rlpost.experimental.one_step_off_policy.main_ppo import translate
from rlpost.trainer.config import ConfigError

pytestmark = pytest.mark.timeout(120)


def test_recipe_runs_split_placement_one_step_off():
    typed = typed_config_of(*SMALL, "trainer.n_gpus_per_node=1", *translate(
        ["--config-name=one_step_off_ppo_trainer", "rollout.nnodes=1", "rollout.n_gpus_per_node=1"]))
    arr = typed.actor_rollout_ref
    assert (arr.hybrid_engine, arr.rollout.n_gpus_per_node, typed.trainer.staleness) == (False, 1, 1)
    assert not arr.rollout.free_cache_engine and arr.rollout.calculate_log_probs
    assert typed.algorithm.rollout_correction.bypass_mode


def test_colocated_recipe_stays_on_policy_and_own_values_win():
    args = translate(["actor_rollout_ref.hybrid_engine=true", "algorithm.rollout_correction.bypass_mode=false"])
    typed = typed_config_of(*SMALL, *args)
    assert typed.actor_rollout_ref.hybrid_engine and typed.trainer.staleness == 0
    assert not typed.algorithm.rollout_correction.bypass_mode


def test_unknown_rollout_key_is_named():
    with pytest.raises(ConfigError, match=r"rollout.n: not a key of verl's one-step-off rollout group"):
        translate(["rollout.n=2"])
