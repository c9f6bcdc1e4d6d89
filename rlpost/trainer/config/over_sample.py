"""Start-up rules of `actor_rollout_ref.rollout.over_sample_rate` (the cut itself: `rlpost.rollout.over_sample`)."""

from __future__ import annotations

import math

from rlpost.config.schema import PPOTrainerConfig
from rlpost.trainer.config.rules import ARR, fail


def check_over_sample(c: PPOTrainerConfig) -> None:
    """A rate > 0 needs requests the engine can abort one by one (`rollout.mode=async`, or multi-turn rollouts,
    which cancel whole trajectories: `rlpost.agent.runner.run_agent_loops`), no dynamic sampling (not built with
    it), and a generation batch whose kept share holds a training batch.

    Raises:
        ConfigError: naming the keys and a value that works.
    """
    rollout, data = c.actor_rollout_ref.rollout, c.data
    rate = rollout.over_sample_rate
    if not rate:
        return
    key = f"{ARR}.rollout.over_sample_rate={rate}"
    if c.algorithm.filter_groups.enable:
        fail(f"not supported yet: {key} with algorithm.filter_groups.enable=true",
             "dynamic sampling already draws generation batches until enough groups are kept",
             f"{ARR}.rollout.over_sample_rate=0")
    if rollout.mode != "async" and not rollout.multi_turn.enable:  # agent loops: one request per turn anyway
        fail(f"{key}, {ARR}.rollout.mode={rollout.mode}",
             "aborting the slowest requests needs each prompt to be its own engine request",
             f"{ARR}.rollout.mode=async")
    need = math.ceil(data.train_batch_size / (1.0 - rate) - 1e-9)
    if data.gen_batch_size < need:
        fail(f"{key}, data.gen_batch_size={data.gen_batch_size}, data.train_batch_size={data.train_batch_size}",
             "a generation batch of gen_batch_size prompts keeps ceil((1 - over_sample_rate) x gen_batch_size) "
             "groups, which must hold a training batch", f"data.gen_batch_size={need}")
