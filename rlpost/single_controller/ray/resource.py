"""Roles and the pools they run on (trainer.nnodes x trainer.n_gpus_per_node, reward-model pool, ...)."""

from __future__ import annotations

from enum import Enum

import ray

from rlpost.single_controller.ray.base import RayResourcePool


class Role(Enum):
    """The worker roles a trainer may create; several may share a pool (colocation)."""

    Actor = 0
    Rollout = 1
    ActorRollout = 2
    Critic = 3
    RefPolicy = 4
    RewardModel = 5
    ActorRolloutRef = 6
    Teacher = 7  # on-policy distillation's frozen teachers


class ResourcePoolManager:
    """Creates the named pools and tells which pool each role uses.

    Args:
        resource_pool_spec: {pool name: processes per node}, e.g. {"global_pool": [n_gpus_per_node] * nnodes}.
        mapping: {role: pool name}.
        use_gpu: GPU bundles; False gives CPU-only bundles ({"CPU": 1}), one process each. None (verl's
            call, which has no such argument): the trainer sets it from `trainer.device` before creating
            the pools; otherwise GPU bundles when the Ray cluster has GPUs.
        max_colocate_count: worker groups (not colocated roles) that may share each bundle.
    """

    def __init__(
        self,
        resource_pool_spec: dict[str, list[int]],
        mapping: dict[Role, str],
        use_gpu: bool | None = None,
        max_colocate_count: int = 1,
    ) -> None:
        for role, pool in mapping.items():
            if pool not in resource_pool_spec:
                raise KeyError(f"role {role} maps to pool {pool!r}, which is not in {sorted(resource_pool_spec)}")
        self.resource_pool_spec = resource_pool_spec
        self.mapping = mapping
        self.use_gpu = use_gpu
        self.max_colocate_count = max_colocate_count
        self.resource_pool_dict: dict[str, RayResourcePool] = {}

    def create_resource_pool(self) -> None:
        """Check the cluster can hold every pool, then create them (placement groups come on first use)."""
        if self.use_gpu is None:
            self.use_gpu = ray.cluster_resources().get("GPU", 0) > 0
        self._check_resource_available()
        for name, process_on_nodes in self.resource_pool_spec.items():
            self.resource_pool_dict[name] = RayResourcePool(
                process_on_nodes, use_gpu=self.use_gpu, name_prefix=name, max_colocate_count=self.max_colocate_count
            )

    def get_resource_pool(self, role: Role) -> RayResourcePool:
        if not self.resource_pool_dict:
            raise RuntimeError("call create_resource_pool() before get_resource_pool()")
        return self.resource_pool_dict[self.mapping[role]]

    def get_n_gpus(self) -> int:
        """Devices (GPUs, or CPU worker processes) over all pools."""
        return sum(sum(nodes) for nodes in self.resource_pool_spec.values())

    def _check_resource_available(self) -> None:
        # Free, not total: the driver may itself be a Ray actor holding a CPU (verl's TaskRunner).
        kind = "GPU" if self.use_gpu else "CPU"
        need = self.get_n_gpus()
        have, total = ray.available_resources().get(kind, 0), ray.cluster_resources().get(kind, 0)
        if need > have:
            raise ValueError(
                f"resource pools {self.resource_pool_spec} need {need} {kind}s; the Ray cluster has {have:g} free "
                f"(of {total:g}). Lower trainer.nnodes * trainer.n_gpus_per_node or raise ray_init.num_cpus"
            )
