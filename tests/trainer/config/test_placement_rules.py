"""Start-up rules of split placement and trainer.staleness, the device count before Ray starts, and the
dry-run plan of both pools."""

import pytest

from rlpost.trainer.config import typed_config, validate_config
from rlpost.trainer.config.plan import dry_run_plan
from rlpost.trainer.ppo.preflight import check_devices
from rlpost.trainer.ppo.roles import resource_pool_spec

ARR = "actor_rollout_ref"
SPLIT = {f"{ARR}.hybrid_engine": False, f"{ARR}.rollout.nnodes": 1, f"{ARR}.rollout.n_gpus_per_node": 1,
         f"{ARR}.rollout.calculate_log_probs": True}


def test_negative_staleness_is_refused(config_error):
    assert "trainer.staleness=-1" in config_error({**SPLIT, "trainer.staleness": -1})


def test_staleness_needs_split_placement(config_error):
    msg = config_error({"trainer.staleness": 1})
    assert f"trainer.staleness=1, {ARR}.hybrid_engine=true" in msg and f"{ARR}.hybrid_engine=false" in msg


def test_split_placement_needs_rollout_devices(config_error):
    msg = config_error({**SPLIT, f"{ARR}.rollout.n_gpus_per_node": 0})
    assert "= 0 rollout devices" in msg and f"{ARR}.rollout.n_gpus_per_node=1" in msg


def test_staleness_needs_rollout_log_probs(config_error):
    msg = config_error({**SPLIT, "trainer.staleness": 1, f"{ARR}.rollout.calculate_log_probs": False})
    assert f"{ARR}.rollout.calculate_log_probs=true" in msg


def test_split_lora_sends_merged_weights_only(small_cfg, config_error):
    """The split engine serves plain weights: LoRA is accepted with the adapters merged into the broadcast,
    serving the adapter unmerged (lora.merge=false) is refused with the key to change."""
    lora = {**SPLIT, f"{ARR}.model.lora_rank": 8, f"{ARR}.model.lora_alpha": 16}
    msg = config_error(lora)
    assert msg.startswith("not supported yet") and f"{ARR}.model.lora.merge=true" in msg
    validate_config(small_cfg({**lora, f"{ARR}.model.lora.merge": True}))


def test_split_plan_and_pools(small_cfg):
    cfg = small_cfg({**SPLIT, "trainer.staleness": 1})
    validate_config(cfg)
    plan = dry_run_plan(typed_config(cfg))
    assert "rollout pool: 1 devices" in plan and "trainer.staleness=1 (one-step-off-policy)" in plan
    assert resource_pool_spec(cfg)["rollout_pool"] == [1]


def test_too_many_devices_fail_before_ray_with_the_sum(small_cfg):
    cfg = small_cfg({**SPLIT, "trainer.device": "cpu", "trainer.n_gpus_per_node": 2, "ray_init.num_cpus": 2})
    with pytest.raises(ValueError, match=r"trainer.n_gpus_per_node=2 \+ .* = 1 rollout = 3 CPU worker processes"
                                         r".*use trainer.n_gpus_per_node=1 and actor_rollout_ref.rollout"
                                         r".n_gpus_per_node=1"):
        check_devices(cfg)
