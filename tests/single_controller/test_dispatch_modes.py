"""verl's dispatch-mode API on real Ray workers: registered and dict modes, named meshes, fuse, worker_env."""

import os
import sys

import pytest
import torch

from rlpost.protocol import DataProto
from rlpost.single_controller.base import Dispatch, Worker, register
from rlpost.single_controller.base.decorator import (DISPATCH_MODE_FN_REGISTRY, make_nd_compute_dataproto_dispatch_fn,
                                                     register_dispatch_mode, update_dispatch_mode)

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.timeout(240)

from rlpost.single_controller.ray import (RayClassWithInitArgs, RayResourcePool, RayWorkerGroup,  # noqa: E402
                                          create_colocated_worker_cls, create_colocated_worker_raw_cls, init_ray)


def _reverse_dispatch(worker_group, x):
    # rank r gets the (world - 1 - r)-th item
    return ([list(reversed(x))], {})


def _sum_collect(worker_group, outputs):
    return sum(outputs)


REVERSED = register_dispatch_mode("TEST_REVERSED", _reverse_dispatch, _sum_collect)
EVERY_OTHER = {"dispatch_fn": lambda wg, n: ([[n] * wg.world_size], {}),
               "collect_fn": lambda wg, outs: outs[::2]}
MESH = make_nd_compute_dataproto_dispatch_fn("pairs")


class MeshWorker(Worker):
    def __init__(self):
        super().__init__()
        # ranks 0,1 form dp rank 0 and 2,3 dp rank 1; ranks 0 and 2 return the result
        self._register_dispatch_collect_info("pairs", dp_rank=self.rank // 2, is_collect=self.rank % 2 == 0)

    @register(dispatch_mode=Dispatch.TEST_REVERSED)
    def times_rank(self, x):
        return x * (self.rank + 1)

    @register(dispatch_mode=EVERY_OTHER)
    def plus_rank(self, n):
        return n + self.rank

    @register(dispatch_mode=MESH)
    def tag_rows(self, data: DataProto) -> DataProto:
        rows = data.batch["x"]
        return DataProto.from_dict({"x": rows, "rank": torch.full_like(rows, self.rank)})

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def getenv(self, name):
        return os.environ.get(name)


@pytest.fixture(scope="module")
def group():
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import test modules
    init_ray({"num_cpus": 6})  # the group of 4 and the fused group of 1
    wg = RayWorkerGroup(RayResourcePool([4], use_gpu=False), RayClassWithInitArgs(MeshWorker),
                        worker_env={"RLPOST_TEST_WORKER_ENV": "seen"})
    yield wg
    wg.shutdown()
    ray.shutdown()


def test_registered_dict_and_updated_modes(group):
    assert Dispatch.TEST_REVERSED is REVERSED and DISPATCH_MODE_FN_REGISTRY[REVERSED]["collect_fn"] is _sum_collect
    # rank r gets item 3 - r: 40*1 + 30*2 + 20*3 + 10*4
    assert group.times_rank([10, 20, 30, 40]) == 40 + 60 + 60 + 40
    assert group.plus_rank(100) == [100, 102]  # ranks 0 and 2 of 100 + rank
    update_dispatch_mode(REVERSED, _reverse_dispatch, lambda wg, outs: outs)
    try:
        assert group.times_rank([1, 1, 1, 1]) == [1, 2, 3, 4]
    finally:
        update_dispatch_mode(REVERSED, _reverse_dispatch, _sum_collect)
    with pytest.raises(ValueError, match="already exists"):
        register_dispatch_mode("TEST_REVERSED", _reverse_dispatch, _sum_collect)
    with pytest.raises(ValueError, match="'dispatch_fn' and 'collect_fn'"):
        register(dispatch_mode={"dispatch_fn": _reverse_dispatch})


def test_named_mesh_splits_by_dp_rank_and_collects_the_marked_ranks(group):
    out = group.tag_rows(DataProto.from_dict({"x": torch.arange(6)}))
    # dp 0 (ranks 0, 1) gets rows 0-2, dp 1 (ranks 2, 3) rows 3-5; ranks 0 and 2 answer
    assert out.batch["x"].tolist() == list(range(6)) and out.batch["rank"].tolist() == [0, 0, 0, 2, 2, 2]
    assert group.mesh_dispatch_info("pairs") == [0, 0, 1, 1]
    assert group.mesh_collect_info("pairs") == [True, False, True, False]
    with pytest.raises(Exception, match="mesh 'other' is not registered"):
        group.mesh_dispatch_info("other")


def test_execute_all_sync_and_worker_env(group):
    assert group.execute_all_sync("getenv", "RLPOST_TEST_WORKER_ENV") == ["seen"] * 4
    assert group.execute_rank_zero_sync("getenv", "RANK") == "0"
    assert os.environ.get("RLPOST_TEST_WORKER_ENV") is None
    with pytest.raises(ValueError, match=r"\['RANK'\] are set by the worker group itself"):
        RayWorkerGroup(RayResourcePool([1], use_gpu=False), RayClassWithInitArgs(MeshWorker), worker_env={"RANK": "3"})


class Plain(Worker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def name(self):
        return "plain"


def test_fuse_binds_each_role_as_an_attribute(group):
    pool = RayResourcePool([1], use_gpu=False)
    fused = RayWorkerGroup(pool, create_colocated_worker_cls({"actor": Plain, "critic": Plain}))
    try:
        fused.fuse(["actor", "critic"])
        assert fused.actor.name() == ["plain"] and fused.critic.name() == ["plain"]
    finally:
        fused.shutdown()
    with pytest.raises(ValueError, match="not supported yet: create_colocated_worker_raw_cls"):
        create_colocated_worker_raw_cls({"actor": RayClassWithInitArgs(Plain)})


def test_worker_mesh_registration_without_ray():
    w = Worker()
    w._register_dispatch_collect_info("m", 2, False)
    assert w._query_dispatch_info("m") == 2 and w.query_collect_info("m") is False
    assert w.get_dispatch_collect() == {"dispatch_dp_rank": {"m": 2}, "collect_dp_rank": {"m": False}}
    w.set_dispatch_collect("copy", {"m": 2}, {"m": False})
    assert w._query_dispatch_info("copy") == 2
    with pytest.raises(ValueError, match="already registered"):
        w._register_dispatch_collect_info("m", 0, True)
    with pytest.raises(KeyError, match="mesh 'x' is not registered"):
        w.query_collect_info("x")
