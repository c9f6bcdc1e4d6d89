"""Start-up rules of the rollout's placement: split placement (`actor_rollout_ref.hybrid_engine=false`),
`trainer.staleness` and `actor_rollout_ref.rollout.mode`."""

from __future__ import annotations

from rlpost.config.schema import PPOTrainerConfig
from rlpost.trainer.config.rules import ARR, fail, lora_key
from rlpost.utils.lora_config import lora_enabled


def check_placement(c: PPOTrainerConfig) -> None:
    """Split placement sizes its own rollout pool; staleness needs it; neither combines with what it cannot
    carry (serving a LoRA adapter unmerged, the HF engine on several rollout ranks)."""
    arr, trainer = c.actor_rollout_ref, c.trainer
    rollout = arr.rollout
    if trainer.staleness < 0:
        fail(f"trainer.staleness={trainer.staleness}", "generations run ahead of training by 0 or more steps",
             "trainer.staleness=0 (on-policy) or 1 (one-step-off-policy)")
    if arr.hybrid_engine:
        if trainer.staleness > 0:
            fail(f"trainer.staleness={trainer.staleness}, {ARR}.hybrid_engine=true",
                 "generating ahead of training needs the rollout on devices of its own",
                 f"{ARR}.hybrid_engine=false with {ARR}.rollout.n_gpus_per_node=1 (or trainer.staleness=0)")
        return
    devices = rollout.nnodes * rollout.n_gpus_per_node
    if devices < 1:
        fail(f"{ARR}.hybrid_engine=false, {ARR}.rollout.nnodes={rollout.nnodes} x {ARR}.rollout.n_gpus_per_node="
             f"{rollout.n_gpus_per_node} = {devices} rollout devices", "split placement needs at least one",
             f"{ARR}.rollout.nnodes=1 {ARR}.rollout.n_gpus_per_node=1")
    tp = rollout.tensor_model_parallel_size
    if rollout.n_gpus_per_node % tp:
        fail(f"{ARR}.rollout.n_gpus_per_node={rollout.n_gpus_per_node}, {ARR}.rollout.tensor_model_parallel_size={tp}",
             "each node's rollout devices hold whole tensor-parallel engines",
             f"{ARR}.rollout.tensor_model_parallel_size=1 or n_gpus_per_node a multiple of {tp}")
    if lora_enabled(arr.model) and not arr.model.lora.merge:
        fail(f"not supported yet: {ARR}.model.lora.merge=false with {lora_key(arr.model)} and "
             f"{ARR}.hybrid_engine=false", "the broadcast to separate rollout devices sends full weights (adapters "
             "merged), the engine does not serve the adapter", f"{ARR}.model.lora.merge=true")
    if trainer.staleness > 0 and not rollout.calculate_log_probs:
        fail(f"trainer.staleness={trainer.staleness}, {ARR}.rollout.calculate_log_probs=false",
             "off-policy batches are measured (and corrected) against the engine's own log-probs",
             f"{ARR}.rollout.calculate_log_probs=true")


def split_devices(c: PPOTrainerConfig) -> int:
    """Devices of a split placement's rollout pool (0 with the hybrid engine)."""
    rollout = c.actor_rollout_ref.rollout
    return 0 if c.actor_rollout_ref.hybrid_engine else rollout.nnodes * rollout.n_gpus_per_node


def split_plan(c: PPOTrainerConfig) -> list[str]:
    """Dry-run lines of a split placement: both pools and how the weights travel."""
    rollout, trainer = c.actor_rollout_ref.rollout, c.trainer
    devices = split_devices(c)
    backend = "gloo" if trainer.device == "cpu" else "NCCL"
    ahead = {0: "on-policy", 1: "one-step-off-policy"}.get(trainer.staleness, f"{trainer.staleness} steps off-policy")
    if trainer.v1.trainer_mode == "separate_async":
        from rlpost.trainer.config.async_plan import async_plan

        return async_plan(c, devices, backend)
    return [
        f"rollout pool: {devices} devices = {ARR}.rollout.nnodes={rollout.nnodes} x n_gpus_per_node="
        f"{rollout.n_gpus_per_node}, {rollout.name} engines, tensor_model_parallel_size="
        f"{rollout.tensor_model_parallel_size}, {devices // rollout.tensor_model_parallel_size} engine(s); "
        f"the trainer devices above hold every other role",
        f"weight sync: trainer rank 0 broadcasts over {backend} to the rollout ranks in buckets of "
        f"{rollout.checkpoint_engine.update_weights_bucket_megabytes} MB after each update; trainer.staleness="
        f"{trainer.staleness} ({ahead})",
    ]
