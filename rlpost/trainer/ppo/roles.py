"""Which worker roles a run creates, and how they are placed (the hybrid engine: roles colocated per pool).

verl's vocabulary: `role_worker_mapping` {Role: worker class or `ray.remote(worker class)`} and a
`ResourcePoolManager` {Role: pool name}. Every pool gets one worker process per device holding all the
roles mapped to it (`create_colocated_worker_cls`), so they share the device and torch.distributed group.
The reference policy mapped to the same class and pool as the actor lives inside the actor worker
(`role="actor_rollout_ref"`); mapped elsewhere it is a role of its own (`role="ref"`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


from rlpost.config import PPOTrainerConfig

from rlpost.single_controller.ray import RayClassWithInitArgs, ResourcePoolManager, Role
from rlpost.single_controller.ray.base import unwrap_actor_class
from rlpost.trainer.config.roles import need_critic, need_reference_policy, need_reward_model


ROLLOUT_POOL = "rollout_pool"
TEACHER_POOL = "teacher_pool"


def resource_pool_spec(config: PPOTrainerConfig) -> dict[str, list[int]]:
    """{pool name: processes per node}: the trainer's devices, plus a split placement's rollout devices."""
    trainer, rollout = config.trainer, config.actor_rollout_ref.rollout
    spec = {"global_pool": [trainer.n_gpus_per_node] * trainer.nnodes}
    if not config.actor_rollout_ref.hybrid_engine:
        spec[ROLLOUT_POOL] = [rollout.n_gpus_per_node] * rollout.nnodes
    distill = config.distillation
    if distill.enabled and distill.nnodes > 0:
        spec[TEACHER_POOL] = [distill.n_gpus_per_node] * distill.nnodes
    return spec


@dataclass
class WorkerGroups:
    """The groups the trainer calls; `critic` / `reward_model` / `ref_policy` / `teacher` are None when not created.

    `ref_policy` is the group whose `compute_ref_log_prob` the trainer calls: the actor group itself when
    the reference lives in the actor worker.
    """

    actor_rollout: Any
    critic: Any | None
    reward_model: Any | None
    ref_policy: Any | None
    rollout: Any | None = None  # split placement: the rollout engines' own group (the actor's has none)
    teacher: Any | None = None  # distillation: the teachers' group (`rlpost.workers.teacher.TeacherWorker`)


@dataclass(frozen=True)
class RolePlan:
    """Which roles a trainer creates, checked against the config.

    Attributes:
        actor_role: `Role.ActorRollout` or `Role.ActorRolloutRef` (the key used in the mapping).
        use_critic / use_reference_policy / use_rm: verl's flags of the same names.
        ref_in_actor: the reference policy is computed by the actor worker group.
        use_teacher: distillation's teachers are a role (`distillation.enabled`).
    """

    actor_role: Role
    use_critic: bool
    use_reference_policy: bool
    use_rm: bool
    ref_in_actor: bool
    use_teacher: bool = False


def default_role_worker_mapping(config: PPOTrainerConfig) -> tuple[dict[Role, type], dict[Role, str]]:
    """The roles `config` needs, all on `global_pool` but a split placement's rollout (`rollout_pool`) and
    teachers with devices of their own (`teacher_pool`): (role_worker_mapping, role -> pool name)."""
    from rlpost.workers.fsdp_workers import ActorRolloutRefWorker, CriticWorker

    workers: dict[Role, type] = {Role.ActorRollout: ActorRolloutRefWorker}
    if not config.actor_rollout_ref.hybrid_engine:
        from rlpost.workers.split_workers import SplitActorWorker, SplitRolloutWorker

        workers = {Role.ActorRollout: SplitActorWorker, Role.Rollout: SplitRolloutWorker}
    if need_reference_policy(config):
        workers[Role.RefPolicy] = ActorRolloutRefWorker
    if need_critic(config):
        workers[Role.Critic] = CriticWorker
    if need_reward_model(config):
        from rlpost.workers.reward_model import RewardModelWorker

        workers[Role.RewardModel] = RewardModelWorker
    if config.distillation.enabled:
        from rlpost.workers.teacher import TeacherWorker

        workers[Role.Teacher] = TeacherWorker
    own = {Role.Rollout: ROLLOUT_POOL, Role.Teacher: TEACHER_POOL if config.distillation.nnodes > 0 else "global_pool"}
    return workers, {role: own.get(role, "global_pool") for role in workers}


def plan_roles(config: PPOTrainerConfig, role_worker_mapping: dict[Role, Any], pools: ResourcePoolManager) -> RolePlan:
    """Check the mapping holds every role the config needs; decide where the reference policy lives.

    Raises:
        ValueError: a role the config needs is missing, or a mapped role has no pool.
    """
    have = sorted(r.name for r in role_worker_mapping)
    actor_role = Role.ActorRolloutRef if Role.ActorRolloutRef in role_worker_mapping else Role.ActorRollout
    if actor_role not in role_worker_mapping:
        raise ValueError(f"role_worker_mapping has roles {have}; the hybrid engine needs Role.ActorRollout "
                         f"(actor + rollout in one worker), e.g. {{Role.ActorRollout: ActorRolloutRefWorker}}")
    for role in role_worker_mapping:
        if role not in pools.mapping:
            raise ValueError(f"Role.{role.name} is in role_worker_mapping but not in the resource pool manager's "
                             f"mapping {sorted(r.name for r in pools.mapping)}: map it to a pool, e.g. 'global_pool'")
    separate_ref = Role.RefPolicy in role_worker_mapping and not _same_worker(
        role_worker_mapping, pools, Role.RefPolicy, actor_role)
    use_ref = actor_role == Role.ActorRolloutRef or Role.RefPolicy in role_worker_mapping
    if need_reference_policy(config) and not use_ref:
        raise ValueError(f"actor_rollout_ref.actor.use_kl_loss / algorithm.use_kl_in_reward need a reference policy; "
                         f"role_worker_mapping has roles {have}: add Role.RefPolicy (e.g. the actor's worker class)")
    use_critic = need_critic(config)
    if use_critic and Role.Critic not in role_worker_mapping:
        raise ValueError(f"algorithm.adv_estimator={config.algorithm.adv_estimator} / critic.enable="
                         f"{config.critic.enable} need a critic; role_worker_mapping has roles {have}: add Role.Critic")
    use_rm = need_reward_model(config)
    if use_rm != (Role.RewardModel in role_worker_mapping):
        raise ValueError(f"reward_model.enable={config.reward_model.enable} but role_worker_mapping has roles {have}: "
                         f"Role.RewardModel must be mapped exactly when a discriminative reward model is used")
    use_teacher = bool(config.distillation.enabled)
    if use_teacher != (Role.Teacher in role_worker_mapping):
        raise ValueError(f"distillation.enabled={config.distillation.enabled} but role_worker_mapping has roles "
                         f"{have}: Role.Teacher (rlpost.workers.teacher.TeacherWorker) must be mapped exactly when "
                         f"distillation.enabled=true")
    return RolePlan(actor_role, use_critic, use_ref, use_rm, ref_in_actor=use_ref and not separate_ref,
                    use_teacher=use_teacher)


def _same_worker(mapping: dict[Role, Any], pools: ResourcePoolManager, a: Role, b: Role) -> bool:
    return (unwrap_actor_class(mapping[a]) is unwrap_actor_class(mapping[b])
            and pools.mapping[a] == pools.mapping[b])


def build_worker_groups(config: PPOTrainerConfig, plan: RolePlan, role_worker_mapping: dict[Role, Any],
                        pools: ResourcePoolManager, ray_worker_group_cls: type,
                        total_training_steps: int) -> WorkerGroups:
    """Create the pools, start one colocated worker group per pool, then initialise every role's models.

    Workers receive the typed sub-configs (`config.actor_rollout_ref`, `config.critic`, ...), and the
    actor and critic the number of optimiser phases their LR schedules span. The rollout-holding actor is
    initialised last so the engine sizes its cache after the others allocated.
    """
    from rlpost.single_controller.ray import create_colocated_worker_cls
    from rlpost.trainer.ppo.profiling import nsight_runtime_env

    specs = _role_specs(config, plan, role_worker_mapping)
    pools.create_resource_pool()
    by_pool: dict[Any, dict[str, RayClassWithInitArgs]] = {}
    for role, (prefix, spec) in specs.items():
        by_pool.setdefault(pools.get_resource_pool(role), {})[prefix] = spec
    views: dict[str, Any] = {}
    for pool, class_dict in by_pool.items():
        colocated = create_colocated_worker_cls(class_dict)
        colocated.options = nsight_runtime_env(config, colocated.options)  # nsys: workers start under it
        group = ray_worker_group_cls(
            resource_pool=pool, ray_cls_with_init=colocated,
            name_prefix=pool.name_prefix or "workers", call_timeout_s=config.trainer.ray_call_timeout,
            startup_timeout_s=config.trainer.ray_wait_register_center_timeout,
            stall_timeout_s=config.trainer.ray_stall_timeout,
        )
        views.update(group.spawn(prefix_set=list(class_dict)))
    if "critic" in views:
        views["critic"].init_model(total_training_steps=total_training_steps)
    for prefix in ("ref", "rm", "teacher"):
        if prefix in views:
            views[prefix].init_model()
    actor = views["actor_rollout"]
    actor.init_model(total_training_steps=total_training_steps)
    if "rollout" in views:
        views["rollout"].init_model()
    ref = actor if plan.ref_in_actor else views.get("ref")
    return WorkerGroups(actor, views.get("critic"), views.get("rm"), ref, views.get("rollout"), views.get("teacher"))


def _role_specs(config: PPOTrainerConfig, plan: RolePlan, mapping: dict[Role, Any]) -> dict[Role, tuple[str, Any]]:
    """{role: (colocated prefix, class + constructor arguments)} for every role the plan creates."""
    actor_kind = "actor_rollout_ref" if plan.ref_in_actor else "actor_rollout"
    if Role.Rollout in mapping:  # split placement: the actor has no engine, and its reference is a role apart
        actor_kind = "actor"
    specs = {plan.actor_role: ("actor_rollout", RayClassWithInitArgs(
        mapping[plan.actor_role], config=config.actor_rollout_ref, role=actor_kind))}
    if Role.Rollout in mapping:
        specs[Role.Rollout] = ("rollout", RayClassWithInitArgs(
            mapping[Role.Rollout], config=config.actor_rollout_ref, role="rollout"))
    if plan.use_reference_policy and not plan.ref_in_actor:
        specs[Role.RefPolicy] = ("ref", RayClassWithInitArgs(
            mapping[Role.RefPolicy], config=config.actor_rollout_ref, role="ref"))
    if plan.use_critic:
        specs[Role.Critic] = ("critic", RayClassWithInitArgs(mapping[Role.Critic], config=config.critic))
    if plan.use_rm:
        specs[Role.RewardModel] = ("rm", RayClassWithInitArgs(mapping[Role.RewardModel], config=config.reward_model))
    if plan.use_teacher:
        specs[Role.Teacher] = ("teacher", RayClassWithInitArgs(mapping[Role.Teacher], config=config.distillation,
                                                               arr_config=config.actor_rollout_ref))
    return specs
