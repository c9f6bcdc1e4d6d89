"""Which roles a trainer creates from a verl-style `role_worker_mapping` (plain or `ray.remote` classes)."""

import pytest
import ray
from omegaconf import OmegaConf

from rlpost.trainer.ppo.ray_trainer import ResourcePoolManager, Role
from rlpost.trainer.ppo.roles import _role_specs, default_role_worker_mapping, plan_roles
from rlpost.workers.fsdp_workers import ActorRolloutRefWorker, CriticWorker


class OtherRefWorker(ActorRolloutRefWorker):
    pass


def _config(estimator="grpo", use_kl_loss=False, rm=False):
    return OmegaConf.create({
        "actor_rollout_ref": {"hybrid_engine": True, "actor": {"use_kl_loss": use_kl_loss}},
        "algorithm": {"adv_estimator": estimator, "use_kl_in_reward": False},
        "critic": {"enable": None}, "distillation": {"enabled": False, "nnodes": 0},
        "reward_model": {"enable": rm, "use_reward_loop": False, "judge": {"enable": False}},
        "custom_reward_function": {"path": None},
    })


def _pools(roles, pool_of=None):
    mapping = {role: (pool_of or {}).get(role, "global_pool") for role in roles}
    return ResourcePoolManager({"global_pool": [2], "ref_pool": [1]}, mapping)


def test_verl_task_runner_mapping_folds_the_reference_into_the_actor():
    workers = {Role.ActorRollout: ray.remote(ActorRolloutRefWorker), Role.RefPolicy: ray.remote(ActorRolloutRefWorker),
               Role.Critic: ray.remote(CriticWorker)}
    config = _config("gae", use_kl_loss=True)
    plan = plan_roles(config, workers, _pools(workers))
    assert (plan.use_critic, plan.use_reference_policy, plan.use_rm, plan.ref_in_actor) == (True, True, False, True)
    specs = _role_specs(config, plan, workers)
    assert {r: prefix for r, (prefix, _) in specs.items()} == {Role.ActorRollout: "actor_rollout",
                                                               Role.Critic: "critic"}
    actor = specs[Role.ActorRollout][1]
    assert actor.cls is ActorRolloutRefWorker and actor.kwargs["role"] == "actor_rollout_ref"


def test_reference_of_another_class_or_pool_is_its_own_role():
    for workers, pool_of in [({Role.ActorRollout: ActorRolloutRefWorker, Role.RefPolicy: OtherRefWorker}, None),
                             ({Role.ActorRollout: ActorRolloutRefWorker, Role.RefPolicy: ActorRolloutRefWorker},
                              {Role.RefPolicy: "ref_pool"})]:
        plan = plan_roles(_config(use_kl_loss=True), workers, _pools(workers, pool_of))
        assert plan.use_reference_policy and not plan.ref_in_actor
        specs = _role_specs(_config(use_kl_loss=True), plan, workers)
        assert specs[Role.ActorRollout][1].kwargs["role"] == "actor_rollout"
        assert specs[Role.RefPolicy][0] == "ref" and specs[Role.RefPolicy][1].kwargs["role"] == "ref"


def test_actor_rollout_ref_role_carries_the_reference():
    workers = {Role.ActorRolloutRef: ray.remote(ActorRolloutRefWorker)}
    plan = plan_roles(_config(use_kl_loss=True), workers, _pools(workers))
    assert plan.actor_role == Role.ActorRolloutRef and plan.ref_in_actor


@pytest.mark.parametrize("config, workers, match", [
    (_config(), {Role.Critic: CriticWorker}, "needs Role.ActorRollout"),
    (_config(use_kl_loss=True), {Role.ActorRollout: ActorRolloutRefWorker}, "add Role.RefPolicy"),
    (_config("gae"), {Role.ActorRollout: ActorRolloutRefWorker}, "adv_estimator=gae .*add Role.Critic"),
    (_config(rm=True), {Role.ActorRollout: ActorRolloutRefWorker}, "reward_model.enable=True"),
])
def test_missing_roles_are_named(config, workers, match):
    with pytest.raises(ValueError, match=match):
        plan_roles(config, workers, _pools(workers))


def test_role_without_pool_is_named():
    workers = {Role.ActorRollout: ActorRolloutRefWorker, Role.Critic: CriticWorker}
    with pytest.raises(ValueError, match="Role.Critic is in role_worker_mapping but not in the resource pool"):
        plan_roles(_config(), workers, _pools([Role.ActorRollout]))


def test_default_mapping_follows_the_config():
    workers, pools = default_role_worker_mapping(_config("gae", use_kl_loss=True))
    assert workers == {Role.ActorRollout: ActorRolloutRefWorker, Role.RefPolicy: ActorRolloutRefWorker,
                       Role.Critic: CriticWorker}
    assert set(pools.values()) == {"global_pool"} and set(pools) == set(workers)


@pytest.mark.parametrize("nnodes, pool", [(0, "global_pool"), (1, "teacher_pool")])
def test_teachers_get_their_own_pool_or_share_the_trainers(nnodes, pool):
    from rlpost.trainer.ppo.roles import resource_pool_spec
    from rlpost.workers.teacher import TeacherWorker

    config = _config()
    config.distillation = {"enabled": True, "nnodes": nnodes, "n_gpus_per_node": 3}
    config.trainer = {"n_gpus_per_node": 2, "nnodes": 1}
    config.actor_rollout_ref.rollout = {"n_gpus_per_node": 1, "nnodes": 1}
    workers, pools = default_role_worker_mapping(config)
    assert workers[Role.Teacher] is TeacherWorker and pools[Role.Teacher] == pool
    spec = resource_pool_spec(config)
    assert spec.get("teacher_pool") == ([3] if nnodes else None) and spec["global_pool"] == [2]
    assert plan_roles(config, workers, ResourcePoolManager(spec, pools)).use_teacher
    with pytest.raises(ValueError, match="Role.Teacher .* must be mapped exactly when distillation.enabled=true"):
        plan_roles(config, {Role.ActorRollout: ActorRolloutRefWorker}, _pools([Role.ActorRollout]))
