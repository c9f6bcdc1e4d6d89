"""Worker groups on local Ray (CPU): dispatch modes, padding, futures, colocation, gloo, errors, time-outs."""

import json
import os
import sys
import time

import numpy as np
import pytest
import torch

from rlpost.keys import INPUT_IDS, UID, VALUES
from rlpost.protocol import DataProto, DataProtoFuture
from rlpost.single_controller.base import Dispatch, Execute, Worker, register

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.timeout(300)  # module start-up: Ray + 8 worker processes importing torch

from rlpost.single_controller.ray import (  # noqa: E402
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    ResourcePoolManager,
    Role,
    WorkerGroupError,
    WorkerGroupTimeoutError,
    create_colocated_worker_cls,
    finish_ray,
    init_ray,
)
from rlpost.single_controller.ray.init import DEFAULT_WORKER_ENV  # noqa: E402


class EchoWorker(Worker):
    """A role whose methods expose what the dispatch sent them."""

    def __init__(self, offset: float = 0.0):
        super().__init__()
        self.offset = offset
        self.last = None

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def whoami(self):
        env = (os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"])
        return self.rank, self.world_size, self.local_rank, self.device, os.getpid(), env

    @register(dispatch_mode=Dispatch.ALL_TO_ALL)
    def add_rank(self, x):
        return x + self.rank

    @register(dispatch_mode=Dispatch.RANK_ZERO)
    def rank_zero(self):
        return self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, execute_mode=Execute.RANK_ZERO)
    def execute_rank_zero(self):
        return self.rank

    @register(dispatch_mode=Dispatch.DP_COMPUTE)
    def dp_compute(self, x):
        self.last = x
        return x, self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def last_seen(self):
        return self.last

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def double(self, data: DataProto) -> DataProto:
        self.last = data.batch[INPUT_IDS].tolist()
        values = data.batch[INPUT_IDS].float() * 2 + self.offset
        return DataProto.from_dict({VALUES: values}, {UID: np.full(len(data), self.rank, dtype=object)})

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO, blocking=False)
    def double_async(self, data: DataProto) -> DataProto:
        return self.double(data)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO, blocking=False)
    def fail_async(self, data: DataProto) -> DataProto:
        if self.rank == 1:
            raise RuntimeError("async failure")
        return self.double(data)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO_WITH_FUNC)
    def apply(self, fn, data: DataProto) -> DataProto:
        return fn(data)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_METRIC)
    def metric(self, data: DataProto) -> dict:
        return {"rows": len(data), "sum": int(data.batch[INPUT_IDS].sum())}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def set_tp(self, tp: int):
        self.set_dispatch_info(self.rank // tp, self.world_size // tp, self.rank % tp == 0)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def fail_on(self, rank: int):
        if self.rank == rank:
            raise ValueError(f"boom on rank {rank}")
        return self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def getenv(self, name: str):
        return os.environ.get(name)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def sleep(self, seconds: float):
        time.sleep(seconds)
        return seconds

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def sleep_async(self, seconds: float):
        time.sleep(seconds)
        return seconds

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def all_reduce(self):
        import torch.distributed as dist

        from rlpost.utils.distributed import init_distributed

        init_distributed("cpu")
        t = torch.tensor([float(self.rank + 1)])
        dist.all_reduce(t)
        return t.item(), dist.get_world_size()


class CriticLike(Worker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def pid_and_pg(self):
        import torch.distributed as dist

        return os.getpid(), dist.is_initialized() and dist.get_world_size()

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def plus_one(self, data: DataProto) -> DataProto:
        return DataProto.from_dict({VALUES: data.batch[VALUES] + 1})


_DRIVER_ENV: dict[str, str | None] = {}  # the worker variables in this process before init_ray


@pytest.fixture(scope="module")
def ray_cfg(tmp_path_factory):
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import test modules
    cfg = {"num_cpus": 8, "timeline_json_file": str(tmp_path_factory.mktemp("ray") / "timeline.json")}
    _DRIVER_ENV.update({k: os.environ.get(k) for k in DEFAULT_WORKER_ENV})
    init_ray(cfg)
    yield cfg
    ray.shutdown()


@pytest.fixture(scope="module")
def group4(ray_cfg):
    wg = RayWorkerGroup(RayResourcePool([4], use_gpu=False), RayClassWithInitArgs(EchoWorker))
    yield wg
    wg.shutdown()


@pytest.fixture(scope="module")
def pools(ray_cfg):
    manager = ResourcePoolManager(
        {"global_pool": [2], "rm_pool": [1]},
        {Role.ActorRollout: "global_pool", Role.Critic: "global_pool", Role.RewardModel: "rm_pool"},
        use_gpu=False,
    )
    manager.create_resource_pool()
    return manager


@pytest.fixture(scope="module")
def colocated(pools):
    cls = create_colocated_worker_cls(
        {"actor_rollout": RayClassWithInitArgs(EchoWorker, offset=0.5), "critic": RayClassWithInitArgs(CriticLike)}
    )
    wg_dict = RayWorkerGroup(pools.get_resource_pool(Role.ActorRollout), ray_cls_with_init=cls)
    yield wg_dict.spawn(prefix_set=["actor_rollout", "critic"])
    wg_dict.shutdown()


def _data(n: int) -> DataProto:
    return DataProto.from_dict({INPUT_IDS: torch.arange(n).unsqueeze(1)}, {UID: [f"u{i}" for i in range(n)]})


def test_rank_env_and_simple_modes(group4):
    infos = group4.whoami()
    assert [i[:4] for i in infos] == [(r, 4, r, "cpu") for r in range(4)]
    assert len({i[4] for i in infos}) == 4 and len({i[5] for i in infos}) == 1
    assert group4.add_rank([10, 20, 30, 40]) == [10, 21, 32, 43]
    assert group4.rank_zero() == 0 and group4.execute_rank_zero() == 0
    assert group4.dp_compute([1, 2, 3, 4]) == [(1, 0), (2, 1), (3, 2), (4, 3)]
    with pytest.raises(ValueError, match="list of 4 items"):
        group4.add_rank(5)


@pytest.mark.timeout(60)
def test_worker_env_reaches_workers_not_the_driver(group4):
    """The cluster started by init_ray hands its workers the defaults; this process's environment is unchanged."""
    expected = {k: _DRIVER_ENV[k] if _DRIVER_ENV[k] is not None else v for k, v in DEFAULT_WORKER_ENV.items()}
    for name, value in expected.items():
        assert group4.getenv(name) == [value] * 4
    assert {k: os.environ.get(k) for k in DEFAULT_WORKER_ENV} == _DRIVER_ENV


@pytest.mark.parametrize("n", range(1, 10))
def test_dp_compute_proto_padding_is_invisible(group4, n):
    out = group4.double(_data(n))
    assert len(out) == n
    assert out.batch[VALUES].flatten().tolist() == [2.0 * i for i in range(n)]
    assert list(out.non_tensor_batch[UID]) == sorted(out.non_tensor_batch[UID])  # dp order kept


def test_with_func_and_metric(group4):
    out = group4.apply(lambda d: d.select(batch_keys=[INPUT_IDS]), _data(6))
    assert out.batch[INPUT_IDS].flatten().tolist() == list(range(6))
    assert group4.metric(_data(8)) == [{"rows": 2, "sum": s} for s in (1, 5, 9, 13)]
    with pytest.raises(ValueError, match="not divisible by dp size 4"):
        group4.metric(_data(6))


def test_tensor_parallel_peers_share_a_shard(group4):
    group4.set_tp(2)  # ranks 0,1 -> dp 0; ranks 2,3 -> dp 1; ranks 0 and 2 collect
    try:
        assert group4.dp_compute(["a", "b"]) == [("a", 0), ("b", 2)]
        out = group4.double(_data(3))
        assert out.batch[VALUES].flatten().tolist() == [0.0, 2.0, 4.0]
        assert list(out.non_tensor_batch[UID]) == [0, 0, 2]
        assert group4.last_seen() == [[[0], [1]], [[0], [1]], [[2], [0]], [[2], [0]]]  # dp 1: row 2 + 1 pad
    finally:
        group4.set_tp(1)
    assert group4.dp_compute([1, 2, 3, 4]) == [(1, 0), (2, 1), (3, 2), (4, 3)]


def test_future_chained_into_another_group(group4, colocated):
    future = group4.double_async(_data(7))
    assert isinstance(future, DataProtoFuture)
    out = colocated["critic"].plus_one(future)
    assert out.batch[VALUES].flatten().tolist() == [2.0 * i + 1 for i in range(7)]
    assert future.get().batch[VALUES].shape == (7, 1)
    with pytest.raises(WorkerGroupError) as info:  # a failure upstream reaches the driver through the chain
        colocated["critic"].plus_one(group4.fail_async(_data(4)))
    assert info.value.method == "plus_one" and "fail_async failed on rank(s) [1]" in str(info.value)
    assert "async failure" in str(info.value)


def test_colocated_roles_share_process_and_process_group(colocated):
    actor, critic = colocated["actor_rollout"], colocated["critic"]
    actor_pids = [i[4] for i in actor.whoami()]
    assert actor.all_reduce() == [(3.0, 2), (3.0, 2)]
    assert critic.pid_and_pg() == [(pid, 2) for pid in actor_pids]
    assert actor.double(_data(3)).batch[VALUES].flatten().tolist() == [0.5, 2.5, 4.5]  # init kwargs reached


def _release(pool: RayResourcePool) -> None:
    for pg in pool.get_placement_groups():
        ray.util.remove_placement_group(pg)


def test_ray_remote_actor_class_is_unwrapped(ray_cfg):
    """verl passes `ray.remote(cls)`: the group builds `cls` with the arguments and keeps its runtime_env."""
    remote_echo = ray.remote(runtime_env={"env_vars": {"RLPOST_TEST_FLAG": "on"}})(EchoWorker)
    spec = RayClassWithInitArgs(cls=remote_echo, offset=1.5)
    assert spec.cls is EchoWorker and spec.roles[""] == (EchoWorker, (), {"offset": 1.5})
    pool = RayResourcePool([1], use_gpu=False)
    wg = RayWorkerGroup(pool, spec)
    try:
        assert "EchoWorker" in wg.name
        assert wg.double(_data(2)).batch[VALUES].flatten().tolist() == [1.5, 3.5]
        assert wg.getenv("RLPOST_TEST_FLAG") == ["on"]
    finally:
        wg.shutdown()
        _release(pool)


def test_colocated_ray_remote_classes(ray_cfg):
    cls = create_colocated_worker_cls(
        {"actor_rollout": RayClassWithInitArgs(ray.remote(EchoWorker), offset=0.5), "critic": ray.remote(CriticLike)})
    assert [spec[0] for spec in cls.roles.values()] == [EchoWorker, CriticLike]
    pool = RayResourcePool([1], use_gpu=False)
    wg = RayWorkerGroup(pool, cls)
    try:
        views = wg.spawn(prefix_set=["actor_rollout", "critic"])
        doubled = views["actor_rollout"].double(_data(2))
        assert views["critic"].plus_one(doubled).batch[VALUES].flatten().tolist() == [1.5, 3.5]
    finally:
        wg.shutdown()
        _release(pool)


def test_not_a_class_is_refused():
    with pytest.raises(TypeError, match="expected a worker class or ray.remote"):
        RayClassWithInitArgs(EchoWorker())


def test_raising_worker_names_rank_and_traceback(group4):
    with pytest.raises(WorkerGroupError) as info:
        group4.fail_on(2)
    err = info.value
    assert err.method == "fail_on" and sorted(err.failures) == [2] and "EchoWorker" in err.group
    assert "ValueError: boom on rank 2" in str(err) and 'line' in str(err) and "in fail_on" in str(err)
    assert group4.fail_on(-1) == [0, 1, 2, 3]  # the group still works


def test_submitting_behind_a_running_non_blocking_call_does_not_wait(group4):
    """A data-parallel call queued behind a running non-blocking one (a generation behind the weight transfer)
    is submitted at once: the group keeps the layout it knew instead of asking the busy ranks again."""
    group4.double(_data(4))  # the layout is known
    asleep = group4.sleep_async(2.0)
    start = time.monotonic()
    doubled = group4.double_async(_data(5))
    assert time.monotonic() - start < 1.0
    assert doubled.get().batch[VALUES].flatten().tolist() == [0.0, 2.0, 4.0, 6.0, 8.0]
    assert asleep.get() == [2.0] * 4 and time.monotonic() - start >= 2.0  # ran in order, after the sleep


def test_sleeping_worker_trips_timeout(group4):
    group4.call_timeout_s = 1.0
    try:
        start = time.monotonic()
        with pytest.raises(WorkerGroupTimeoutError, match=r"EchoWorker\.sleep timed out .*rank\(s\) \[0, 1, 2, 3\]"):
            group4.sleep(3)
        assert time.monotonic() - start < 3
    finally:
        group4.call_timeout_s = 60.0
    assert group4.rank_zero() == 0  # queued behind the sleep, then answers


def test_resource_pool_manager_checks_cluster(pools):
    assert pools.get_resource_pool(Role.Critic) is pools.get_resource_pool(Role.ActorRollout)
    assert pools.get_resource_pool(Role.RewardModel).store == [1] and pools.get_n_gpus() == 3
    manager = ResourcePoolManager({"global_pool": [64]}, {Role.Actor: "global_pool"}, use_gpu=False)
    with pytest.raises(ValueError, match="need 64 CPUs"):
        manager.create_resource_pool()
    with pytest.raises(KeyError, match="not_a_pool"):
        ResourcePoolManager({"global_pool": [1]}, {Role.Actor: "not_a_pool"}, use_gpu=False)


def test_resource_pool_manager_counts_free_cpus(group4):
    """CPUs held by running actors (e.g. a driver running as verl's TaskRunner) are not available to pools."""
    free = int(ray.available_resources().get("CPU", 0))
    assert free < 8  # group4's workers hold bundles
    fits = ResourcePoolManager({"global_pool": [free]}, {Role.Actor: "global_pool"})  # verl's call: no use_gpu
    fits.create_resource_pool()
    assert fits.use_gpu is False  # no GPU in this cluster
    with pytest.raises(ValueError, match=rf"need {free + 1} CPUs; the Ray cluster has {free} free \(of 8\)"):
        ResourcePoolManager({"global_pool": [free + 1]}, {Role.Actor: "global_pool"}, use_gpu=False
                            ).create_resource_pool()


def test_dataproto_round_trip_through_ray(ray_cfg):
    data = _data(5)
    data.meta_info["temperature"] = 0.7
    back = ray.get(ray.put(data.slice(1, 4)))
    assert back.batch[INPUT_IDS].flatten().tolist() == [1, 2, 3]
    assert list(back.non_tensor_batch[UID]) == ["u1", "u2", "u3"] and back.meta_info == {"temperature": 0.7}


def test_finish_ray_writes_timeline(ray_cfg):
    assert finish_ray(ray_cfg, shutdown=False) == ray_cfg["timeline_json_file"]
    events = json.load(open(ray_cfg["timeline_json_file"]))
    assert isinstance(events, list) and len(events) > 0
