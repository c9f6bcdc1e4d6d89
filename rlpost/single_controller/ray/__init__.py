"""Ray side of the single controller: resource pools, worker groups, colocation, start-up."""

from rlpost.single_controller.ray.base import (
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    create_colocated_worker_cls,
    create_colocated_worker_raw_cls,
)
from rlpost.single_controller.ray.errors import WorkerGroupError, WorkerGroupTimeoutError
from rlpost.single_controller.ray.init import finish_ray, init_ray
from rlpost.single_controller.ray.resource import ResourcePoolManager, Role

__all__ = [
    "RayClassWithInitArgs",
    "RayResourcePool",
    "RayWorkerGroup",
    "ResourcePoolManager",
    "Role",
    "WorkerGroupError",
    "WorkerGroupTimeoutError",
    "create_colocated_worker_cls",
    "create_colocated_worker_raw_cls",
    "finish_ray",
    "init_ray",
]
