"""Start-up rules of `trainer.v1.trainer_mode=separate_async` (the fully asynchronous queue) and the refusal of
the v1 parts that are not built."""

import pytest

from rlpost.trainer.config import typed_config
from rlpost.trainer.config.async_rules import queue_depth, sync_every

pytestmark = pytest.mark.timeout(60)

ARR = "actor_rollout_ref"
ASYNC = {f"{ARR}.hybrid_engine": False, f"{ARR}.rollout.nnodes": 1, f"{ARR}.rollout.n_gpus_per_node": 1,
         f"{ARR}.rollout.calculate_log_probs": True, "trainer.v1.trainer_mode": "separate_async",
         "trainer.v1.separate_async.num_warmup_batches": 2, "trainer.v1.separate_async.parameter_sync_step": 2,
         "trainer.v1.sampler.max_off_policy_threshold": 2, "trainer.save_freq": 2}


def test_separate_async_reads_the_queue_from_v1(small_cfg):
    typed = typed_config(small_cfg(ASYNC))
    assert (queue_depth(typed), sync_every(typed)) == (2, 2)
    assert typed.trainer.v1.sampler.max_off_policy_strategy == "drop"
    plain = typed_config(small_cfg({**ASYNC, "trainer.v1.trainer_mode": "sync", "trainer.staleness": 1}))
    assert (queue_depth(plain), sync_every(plain)) == (1, 1)  # sync mode: one-step-off, weights every step


@pytest.mark.parametrize("values, expected", [
    ({f"{ARR}.hybrid_engine": True}, f"{ARR}.hybrid_engine=false"),
    ({"trainer.staleness": 1}, "trainer.staleness=0 (or 2)"),
    ({f"{ARR}.rollout.calculate_log_probs": False}, f"{ARR}.rollout.calculate_log_probs=true"),
    ({"trainer.v1.separate_async.parameter_sync_step": 4}, "trainer.v1.sampler.max_off_policy_threshold=3"),
    ({"trainer.save_freq": 3}, "trainer.save_freq=4"),
    ({"trainer.v1.sampler.max_off_policy_strategy": "keep"}, "drop"),
    ({"trainer.v1.trainer_mode": "colocate_async"}, "not supported yet: trainer.v1.trainer_mode=colocate_async"),
    ({"trainer.v1.sampler.sync_refill_failed_groups": True},
     "not supported yet: trainer.v1.sampler.sync_refill_failed_groups=true"),
    ({"trainer.v1.sampler.sampler_kwargs": {"a": 1}}, "not supported yet: trainer.v1.sampler.sampler_kwargs="),
    ({"trainer.v1.separate_async.hybrid_rollout.enable_switch": True},
     "not supported yet: trainer.v1.separate_async.hybrid_rollout.enable_switch=true"),
    ({"trainer.v1.trainer_mode": "sync", "trainer.v1.separate_async.partial_rollout": True},
     "use trainer.v1.trainer_mode=separate_async (or trainer.v1.separate_async.partial_rollout=false)"),
    ({"trainer.v1.separate_async.partial_rollout": True, f"{ARR}.rollout.multi_turn.enable": True},
     "not supported yet: trainer.v1.separate_async.partial_rollout=true with"),
    ({"trainer.v1.separate_async.partial_rollout": True, f"{ARR}.rollout.mode": "async",
      f"{ARR}.rollout.over_sample_rate": 0.2, "data.gen_batch_size": 10},
     "the tail cut is not applied to resumed segments"),
    ({"trainer.v1.separate_async.partial_rollout_tokens": 0},
     "trainer.v1.separate_async.partial_rollout_tokens=0"),
])
def test_bad_async_settings_fail_at_start_up_naming_a_value_that_works(config_error, values, expected):
    assert expected in config_error({**ASYNC, **values})


def test_partial_rollouts_are_read_with_their_pause_point(small_cfg):
    typed = typed_config(small_cfg({**ASYNC, "trainer.v1.separate_async.partial_rollout": True,
                                    "trainer.v1.separate_async.partial_rollout_tokens": 8}))
    sa = typed.trainer.v1.separate_async
    assert (sa.partial_rollout, sa.partial_rollout_tokens) == (True, 8)


def test_dry_run_plan_shows_the_queue(small_cfg):
    from rlpost.trainer.config.plan import dry_run_plan

    plan = dry_run_plan(typed_config(small_cfg({**ASYNC, "trainer.v1.sampler.max_off_policy_strategy": "wait"})))
    assert ("2 generation(s) queued beyond the batch being trained; trainer rank 0 broadcasts the weights over "
            "gloo every 2 update(s)") in plan and "staleness bound 2 versions (wait)" in plan
