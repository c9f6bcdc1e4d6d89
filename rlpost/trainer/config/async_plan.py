"""Dry-run lines of the fully asynchronous mode (`trainer.v1.trainer_mode=separate_async`)."""

from __future__ import annotations

from rlpost.config.schema import PPOTrainerConfig
from rlpost.trainer.config.rules import ARR


def async_plan(c: PPOTrainerConfig, devices: int, backend: str) -> list[str]:
    """Both pools, the queue, the push interval and the staleness bound."""
    rollout, v1 = c.actor_rollout_ref.rollout, c.trainer.v1
    return [
        f"rollout pool: {devices} devices = {ARR}.rollout.nnodes={rollout.nnodes} x n_gpus_per_node="
        f"{rollout.n_gpus_per_node}, {rollout.name} engines generating continuously; the trainer devices above "
        f"hold every other role",
        f"fully async (trainer.v1.trainer_mode=separate_async): {v1.separate_async.num_warmup_batches} generation(s) "
        f"queued beyond the batch being trained; trainer rank 0 broadcasts the weights over {backend} every "
        f"{v1.separate_async.parameter_sync_step} update(s) in buckets of "
        f"{rollout.checkpoint_engine.update_weights_bucket_megabytes} MB; staleness bound "
        f"{v1.sampler.max_off_policy_threshold} versions ({v1.sampler.max_off_policy_strategy})"
        + (f"; partial rollouts: a queued generation pauses every {v1.separate_async.partial_rollout_tokens} "
           "tokens per response and resumes after each push with the new weights"
           if v1.separate_async.partial_rollout else ""),
    ]
