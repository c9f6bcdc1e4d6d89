"""Which worker groups a run needs, and how they are placed (the hybrid engine: all roles colocated).

Every role lives in the same worker processes, one per device: the actor (+ rollout engine + reference
model), the critic when the estimator needs values, and the reward model when enabled. They share each
process's device and its torch.distributed group.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig

from rlpost.trainer.config.roles import need_critic, need_reference_policy


@dataclass
class WorkerGroups:
    """The groups the trainer calls; `critic` / `reward_model` are None when the run has none."""

    actor_rollout: Any
    critic: Any | None
    reward_model: Any | None
    has_ref: bool


def actor_role_name(config: DictConfig) -> str:
    """`actor_rollout_ref` when a reference policy is needed, else `actor_rollout`."""
    return "actor_rollout_ref" if need_reference_policy(config) else "actor_rollout"


def build_worker_groups(config: DictConfig) -> WorkerGroups:
    """Start the colocated worker processes and initialise every role's models (rollout last)."""
    from rlpost.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
    from rlpost.single_controller.ray import create_colocated_worker_cls
    from rlpost.workers.fsdp_workers import ActorRolloutRefWorker, CriticWorker

    trainer = config.trainer
    if not config.actor_rollout_ref.hybrid_engine:
        raise ValueError("not supported yet: actor_rollout_ref.hybrid_engine=false (rollout on separate devices); "
                         "use actor_rollout_ref.hybrid_engine=true")
    pool = RayResourcePool(
        process_on_nodes=[trainer.n_gpus_per_node] * trainer.nnodes,
        use_gpu=trainer.device == "cuda",
        name_prefix="global_pool",
    )
    class_dict = {"actor_rollout": RayClassWithInitArgs(
        ActorRolloutRefWorker, config=config.actor_rollout_ref, role=actor_role_name(config))}
    if need_critic(config):
        class_dict["critic"] = RayClassWithInitArgs(CriticWorker, config=config.critic)
    if config.reward_model.enable:
        from rlpost.workers.reward_model import RewardModelWorker

        class_dict["rm"] = RayClassWithInitArgs(RewardModelWorker, config=config.reward_model)
    group = RayWorkerGroup(
        pool, create_colocated_worker_cls(class_dict), name_prefix="workers",
        call_timeout_s=trainer.ray_call_timeout,
        startup_timeout_s=trainer.ray_wait_register_center_timeout,
    )
    views = group.spawn(prefix_set=list(class_dict))
    critic, rm = views.get("critic"), views.get("rm")
    for wg in (critic, rm):
        if wg is not None:
            wg.init_model()
    views["actor_rollout"].init_model()  # last: the engine sizes its cache after the others allocated
    return WorkerGroups(views["actor_rollout"], critic, rm, has_ref=need_reference_policy(config))
