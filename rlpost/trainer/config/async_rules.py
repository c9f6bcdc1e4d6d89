"""Start-up rules of the fully asynchronous mode, `trainer.v1.trainer_mode=separate_async` (docs/async.md)."""

from __future__ import annotations

from rlpost.config.schema import PPOTrainerConfig
from rlpost.trainer.config.rules import ARR, fail

V1 = "trainer.v1"


def queue_depth(c: PPOTrainerConfig) -> int:
    """Generations queued ahead of the batch being trained: `trainer.staleness`, or in separate_async mode
    `trainer.v1.separate_async.num_warmup_batches`."""
    if c.trainer.v1.trainer_mode == "separate_async":
        return c.trainer.v1.separate_async.num_warmup_batches
    return c.trainer.staleness


def sync_every(c: PPOTrainerConfig) -> int:
    """Trainer steps between two weight pushes (1 outside separate_async mode)."""
    v1 = c.trainer.v1
    return v1.separate_async.parameter_sync_step if v1.trainer_mode == "separate_async" else 1


def check_async(c: PPOTrainerConfig) -> None:
    """separate_async needs split placement and the engine's log-probs; its staleness bound must be reachable
    and its checkpoints must fall on weight pushes (so a resumed run sends the engines the weights they had)."""
    v1, trainer = c.trainer.v1, c.trainer
    if v1.trainer_mode != "separate_async":
        if v1.separate_async.partial_rollout:
            fail(f"{V1}.separate_async.partial_rollout=true, {V1}.trainer_mode={v1.trainer_mode}",
                 "partial rollouts pause the generations queued ahead of training at a weight push",
                 f"{V1}.trainer_mode=separate_async (or {V1}.separate_async.partial_rollout=false)")
        return
    _check_partial(c)
    mode = f"{V1}.trainer_mode=separate_async"
    if c.actor_rollout_ref.hybrid_engine:
        fail(f"{mode}, {ARR}.hybrid_engine=true", "the rollout generates continuously on devices of its own",
             f"{ARR}.hybrid_engine=false with {ARR}.rollout.n_gpus_per_node=1")
    depth = v1.separate_async.num_warmup_batches
    if trainer.staleness not in (0, depth):
        fail(f"{mode}, trainer.staleness={trainer.staleness}, {V1}.separate_async.num_warmup_batches={depth}",
             "both set how many generations run ahead of training", f"trainer.staleness=0 (or {depth})")
    if not c.actor_rollout_ref.rollout.calculate_log_probs:
        fail(f"{mode}, {ARR}.rollout.calculate_log_probs=false",
             "off-policy batches are measured (and corrected) against the engine's own log-probs",
             f"{ARR}.rollout.calculate_log_probs=true")
    every, bound = v1.separate_async.parameter_sync_step, v1.sampler.max_off_policy_threshold
    if bound < every - 1:
        fail(f"{V1}.sampler.max_off_policy_threshold={bound}, {V1}.separate_async.parameter_sync_step={every}",
             f"with weights pushed every {every} steps a batch generated right after a push is trained up to "
             f"{every - 1} versions later", f"{V1}.sampler.max_off_policy_threshold={every - 1}")
    if trainer.save_freq > 0 and trainer.save_freq % every:
        fail(f"trainer.save_freq={trainer.save_freq}, {V1}.separate_async.parameter_sync_step={every}",
             "a checkpoint must fall on a weight push, so a resumed run sends the engines the weights they had",
             f"trainer.save_freq={every * max(1, round(trainer.save_freq / every))}")
    if c.algorithm.filter_groups.enable:
        fail(f"not supported yet: {mode} with algorithm.filter_groups.enable=true",
             "dynamic sampling draws further batches inside a step; the async queue serves one batch a step",
             "algorithm.filter_groups.enable=false (or trainer.v1.trainer_mode=sync with trainer.staleness=1)")


def _check_partial(c: PPOTrainerConfig) -> None:
    """Partial rollouts resubmit each response's tokens as a plain prompt: one engine per rank, no agent loop,
    no tail cut."""
    rollout = c.actor_rollout_ref.rollout
    key = f"{V1}.separate_async.partial_rollout=true"
    if not c.trainer.v1.separate_async.partial_rollout:
        return
    if rollout.multi_turn.enable:
        fail(f"not supported yet: {key} with {ARR}.rollout.multi_turn.enable=true",
             "an agent loop's turns are not resumed from a paused segment",
             f"{V1}.separate_async.partial_rollout=false")
    if rollout.over_sample_rate > 0:
        fail(f"not supported yet: {key} with {ARR}.rollout.over_sample_rate={rollout.over_sample_rate}",
             "the tail cut is not applied to resumed segments", f"{ARR}.rollout.over_sample_rate=0")
    if rollout.tensor_model_parallel_size > 1:
        fail(f"not supported yet: {key} with {ARR}.rollout.tensor_model_parallel_size="
             f"{rollout.tensor_model_parallel_size}", "a segment's rows are continued rank by rank",
             f"{ARR}.rollout.tensor_model_parallel_size=1")
