"""Resource pools (placement groups), worker groups (one Ray actor per bundle) and colocation."""

from __future__ import annotations

import functools
from typing import Any

import ray
from ray.util.placement_group import PlacementGroup, placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from rlpost.protocol import DataProtoFuture
from rlpost.single_controller.base.decorator import (
    DpLayout,
    Execute,
    RegisterInfo,
    collect_fn_for,
    custom_fns,
    plan_calls,
    registered_methods,
)
from rlpost.single_controller.ray.diagnostics import WorkerInfo, driver_env
from rlpost.single_controller.ray.errors import Gatherer, error_text
from rlpost.single_controller.ray.host import WorkerHost


class RayResourcePool:
    """`process_on_nodes[i]` worker processes on node i, each one bundle of a per-node placement group.

    A bundle is {"CPU": 1} (+ {"GPU": 1} with use_gpu). `max_colocate_count` worker groups may share
    a bundle (each actor then asks 1/max_colocate_count of it); colocated roles in ONE process
    (`create_colocated_worker_cls`) need only 1.
    """

    def __init__(
        self,
        process_on_nodes: list[int],
        use_gpu: bool = True,
        name_prefix: str = "",
        max_colocate_count: int = 1,
    ) -> None:
        if not process_on_nodes or any(n <= 0 for n in process_on_nodes):
            raise ValueError(f"process_on_nodes must be positive counts, got {process_on_nodes}")
        self.store = list(process_on_nodes)
        self.use_gpu = use_gpu
        self.name_prefix = name_prefix
        self.max_colocate_count = max_colocate_count
        self._pgs: list[PlacementGroup] | None = None

    @property
    def world_size(self) -> int:
        return sum(self.store)

    @property
    def device(self) -> str:
        return "cuda" if self.use_gpu else "cpu"

    def bundle(self) -> dict[str, float]:
        return {"CPU": 1, "GPU": 1} if self.use_gpu else {"CPU": 1}

    def get_placement_groups(self, timeout_s: float = 300.0) -> list[PlacementGroup]:
        """One STRICT_PACK placement group per node, created once and waited for."""
        if self._pgs is None:
            pgs = [placement_group([self.bundle()] * n, strategy="STRICT_PACK") for n in self.store]
            try:
                ray.get([pg.ready() for pg in pgs], timeout=timeout_s)
            except ray.exceptions.GetTimeoutError as exc:
                for pg in pgs:
                    ray.util.remove_placement_group(pg)
                raise TimeoutError(
                    f"resource pool {self.name_prefix!r}: placement groups {self.store} x {self.bundle()} not "
                    f"ready after {timeout_s} s; cluster has {ray.cluster_resources()}"
                ) from exc
            self._pgs = pgs
        return self._pgs


def unwrap_actor_class(cls: Any) -> type:
    """The plain class behind `cls`, which may be a class or a Ray actor class (`ray.remote(cls)`).

    Roles are built inside a `WorkerHost` actor, never as Ray actors of their own, so only the user's
    class is needed; Ray keeps it as `__ray_actor_class__` on the class `ray.remote` derived from it.
    """
    if isinstance(cls, type) and not isinstance(cls, ray.actor.ActorClass):
        return cls
    metadata = getattr(cls, "__ray_metadata__", None)
    plain = getattr(getattr(metadata, "modified_class", None), "__ray_actor_class__", None)
    if not isinstance(plain, type):
        raise TypeError(f"expected a worker class or ray.remote(worker class), got {cls!r}")
    return plain


def _actor_class_options(cls: Any) -> dict[str, Any]:
    """The `runtime_env` given to `ray.remote(...)`; resources come from the resource pool instead."""
    metadata = getattr(cls, "__ray_metadata__", None)
    runtime_env = getattr(metadata, "runtime_env", None)
    return {"runtime_env": runtime_env} if runtime_env else {}


class RayClassWithInitArgs:
    """A role class and its constructor arguments, built later inside each worker process.

    Args:
        cls: the role class, or the Ray actor class `ray.remote(cls)` (verl's convention); the latter is
            unwrapped to `cls`, keeping its `runtime_env` (num_cpus / num_gpus come from the pool).
        *args, **kwargs: constructor arguments of `cls`.
    """

    def __init__(self, cls: Any, *args: Any, **kwargs: Any) -> None:
        self.cls = unwrap_actor_class(cls)
        self.args, self.kwargs = args, kwargs
        self.options: dict[str, Any] = _actor_class_options(cls)
        self.roles: dict[str, tuple[type, tuple, dict]] = {"": (self.cls, args, kwargs)}

    def update_options(self, options: dict[str, Any]) -> None:
        """Extra Ray actor options (e.g. runtime_env) for the worker processes."""
        self.options.update(options)


def create_colocated_worker_raw_cls(class_dict: dict[str, RayClassWithInitArgs]) -> type:
    """verl's fused-worker class builder: not supported yet (rlpost colocates roles in one `WorkerHost` process
    instead, with the same effect on placement)."""
    raise ValueError(f"not supported yet: create_colocated_worker_raw_cls({sorted(class_dict)}) (verl's fused "
                     "worker classes); use create_colocated_worker_cls(class_dict) and then group.spawn(prefixes) "
                     "or group.fuse(prefixes)")


def create_colocated_worker_cls(class_dict: dict[str, RayClassWithInitArgs | Any]) -> RayClassWithInitArgs:
    """One worker process per bundle holding all roles of `class_dict`; use `group.spawn(...)` for views.

    A value is a `RayClassWithInitArgs`, or a bare class / `ray.remote` class built without arguments.
    """
    colocated = RayClassWithInitArgs(WorkerHost)
    colocated.cls = None
    colocated.roles = {}
    for prefix, spec in class_dict.items():
        if not isinstance(spec, RayClassWithInitArgs):
            spec = RayClassWithInitArgs(spec)
        colocated.roles[prefix] = (spec.cls, spec.args, spec.kwargs)
        colocated.options.update(spec.options)
    return colocated


class RayWorkerGroup:
    """One Ray actor per bundle of `resource_pool`; @register-ed methods of the role become methods here.

    Args:
        resource_pool: where the workers run.
        ray_cls_with_init: the role (or, from `create_colocated_worker_cls`, several roles).
        name_prefix: group name used in errors (default: the role class name).
        call_timeout_s: time-out of every method call (trainer.ray_call_timeout).
        startup_timeout_s: time-out of start-up (trainer.ray_wait_register_center_timeout).
        stall_timeout_s: a call running this long logs the Python stacks of the ranks that have not answered
            (trainer.ray_stall_timeout); None never does.
        worker_env: extra environment variables of every worker process (verl's argument); the group's own
            (RANK, WORLD_SIZE, MASTER_ADDR, ...) cannot be overridden.
    """

    def __init__(
        self,
        resource_pool: RayResourcePool,
        ray_cls_with_init: RayClassWithInitArgs,
        name_prefix: str | None = None,
        call_timeout_s: float = 3600.0,
        startup_timeout_s: float = 300.0,
        stall_timeout_s: float | None = None,
        worker_env: dict[str, str] | None = None,
    ) -> None:
        roles = ray_cls_with_init.roles
        clash = sorted(set(worker_env or {}) & set(GROUP_ENV_KEYS + tuple(driver_env())))
        if clash:
            raise ValueError(f"RayWorkerGroup(worker_env=...): {clash} are set by the worker group itself and "
                             "cannot be overridden")
        self.name = name_prefix or "+".join(spec[0].__name__ for spec in roles.values())
        self.call_timeout_s, self.stall_timeout_s = call_timeout_s, stall_timeout_s
        self.resource_pool = resource_pool
        self._hosts = _start_hosts(resource_pool, ray_cls_with_init.options, startup_timeout_s)
        env = _rank_envs(self._hosts, resource_pool, startup_timeout_s)
        env = [{**e, **{k: str(v) for k, v in (worker_env or {}).items()}} for e in env]
        label = "-".join(p for p in roles if p) or self.name  # its processes' log files start with it
        label = "".join(c if c.isalnum() or c in "_-." else "-" for c in label)
        ranks = list(range(len(self._hosts)))
        setup = Gatherer(self.name, "setup", ranks, startup_timeout_s,
                         timeout_key="trainer.ray_wait_register_center_timeout")
        self.workers: list[WorkerInfo] = setup([h.setup.remote(e, label) for h, e in zip(self._hosts, env)])
        # the roles' constructors (model loading, process groups) may hang: with the workers known, a stall
        # there is reported with every late rank's stack, as in any later call
        build = Gatherer(self.name, "__init__", ranks, startup_timeout_s, stall_timeout_s, self.workers,
                         timeout_key="trainer.ray_wait_register_center_timeout")
        build([h.build_roles.remote(roles) for h in self._hosts])
        self.pids = [w.pid for w in self.workers]
        self._prefix: str | None = None
        self._layout: DpLayout | None = None
        self._mesh_info: dict[tuple[str, str], list] = {}
        self._roles = roles
        if list(roles) == [""]:
            self._bind("", roles[""][0])

    @property
    def world_size(self) -> int:
        return len(self._hosts)

    def spawn(self, prefix_set: Any) -> dict[str, RayWorkerGroup]:
        """{prefix: a view of this group bound to that colocated role's methods}."""
        views = {}
        for prefix in prefix_set:
            if prefix not in self._roles:
                raise KeyError(f"spawn: no colocated role {prefix!r}; roles are {sorted(self._roles)}")
            view = object.__new__(RayWorkerGroup)
            view.__dict__.update(self.__dict__)
            view.name, view._layout, view._mesh_info = f"{self.name}/{prefix}", None, {}
            view._bind(prefix, self._roles[prefix][0])
            views[prefix] = view
        return views

    def fuse(self, prefix_set: Any) -> None:
        """verl's fused group: each colocated role's view becomes an attribute of this group (`group.actor.x()`)."""
        for prefix, view in self.spawn(prefix_set).items():
            setattr(self, prefix, view)

    def _bind(self, prefix: str, cls: type) -> None:
        self._prefix = prefix
        for method, info in registered_methods(cls).items():
            bound = functools.partial(self._call, method, info)
            functools.update_wrapper(bound, getattr(cls, method))
            setattr(self, method, bound)

    def _dp_layout(self) -> DpLayout:
        if self._layout is None:
            refs = [h.dispatch_info.remote(self._prefix) for h in self._hosts]
            reports = self._gatherer("get_dispatch_info", list(range(self.world_size)))(refs)
            self._layout = DpLayout.from_reports(reports)
        return self._layout

    def _call(self, method: str, info: RegisterInfo, *args: Any, **kwargs: Any) -> Any:
        """Dispatch, run on the ranks, then collect (blocking) or return a DataProtoFuture."""
        fns = custom_fns(info.dispatch_mode)
        if fns is not None:
            return self._call_custom(method, info, fns, args, kwargs)
        layout = self._dp_layout() if info.uses_dp_layout else DpLayout.plain(self.world_size)
        if not info.uses_dp_layout and info.blocking:
            # a blocking call (e.g. init_model) may change the data-parallel layout. A non-blocking one (the
            # weight transfer) keeps it: re-asking would queue behind the calls the ranks are running and
            # stall the driver until they end (a generation submitted ahead would then wait on its predecessor)
            self._layout = None
        calls = plan_calls(info, layout, args, kwargs)
        refs = [self._hosts[c.rank].call.remote(self._prefix, method, c.args, c.kwargs, c.trim) for c in calls]
        ranks = [c.rank for c in calls]
        future = DataProtoFuture(
            collect_fn=collect_fn_for(info, layout, ranks),
            futures=refs,
            fetch_fn=self._gatherer(method, ranks),
        )
        return future.get() if info.blocking else future

    def _call_custom(self, method: str, info: RegisterInfo, fns: dict, args: tuple, kwargs: dict) -> Any:
        """A dispatch mode of the user's: its dispatch_fn gives per-rank argument lists, its collect_fn the result."""
        self._layout = None  # the user's method may change the rank's layout, as any non-dp call may
        per_args, per_kwargs = fns["dispatch_fn"](self, *args, **kwargs)
        for value in list(per_args) + list(per_kwargs.values()):
            if not isinstance(value, (list, tuple)) or len(value) != self.world_size:
                raise ValueError(f"{self.name}.{method}: the dispatch_fn must give every argument as a list of "
                                 f"{self.world_size} items (one per rank), got {type(value).__name__}")
        ranks = [0] if info.execute_mode == Execute.RANK_ZERO else list(range(self.world_size))
        refs = [self._hosts[r].call.remote(self._prefix, method, tuple(a[r] for a in per_args),
                                           {k: v[r] for k, v in per_kwargs.items()}, 0) for r in ranks]
        future = DataProtoFuture(collect_fn=functools.partial(fns["collect_fn"], self), futures=refs,
                                 fetch_fn=self._gatherer(method, ranks))
        return future.get() if info.blocking else future

    def mesh_dispatch_info(self, mesh_name: str) -> list[int]:
        """Each rank's dp rank in mesh `mesh_name` (asked once, then kept)."""
        key = (self._prefix or "", "dispatch:" + mesh_name)
        if key not in self._mesh_info:
            self._mesh_info[key] = self.execute_all_sync("_query_dispatch_info", mesh_name)
        return self._mesh_info[key]

    def mesh_collect_info(self, mesh_name: str) -> list[bool]:
        """Whether each rank's result is returned for mesh `mesh_name` (asked once, then kept)."""
        key = (self._prefix or "", "collect:" + mesh_name)
        if key not in self._mesh_info:
            self._mesh_info[key] = self.execute_all_sync("_query_collect_info", mesh_name)
        return self._mesh_info[key]

    def execute_all_sync(self, method: str, *args: Any, **kwargs: Any) -> list:
        """verl's name of `execute_all` (blocking here too): every rank's result, in rank order."""
        return self.execute_all(method, *args, **kwargs)

    def execute_rank_zero_sync(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Call any method on rank 0 only; blocking."""
        ref = self._hosts[0].call.remote(self._prefix, method, args, kwargs, 0)
        return self._gatherer(method, [0])([ref])[0]

    def execute_all(self, method: str, *args: Any, **kwargs: Any) -> list:
        """Call any method (registered or not) with the same arguments on every rank; blocking."""
        self._layout = None
        refs = [h.call.remote(self._prefix, method, args, kwargs, 0) for h in self._hosts]
        return self._gatherer(method, list(range(self.world_size)))(refs)

    def _gatherer(self, method: str, ranks: list[int]) -> Gatherer:
        return Gatherer(self.name, method, ranks, self.call_timeout_s, self.stall_timeout_s, self.workers)

    def dead_workers(self, wait_s: float = 10.0) -> dict[int, str]:
        """{rank: Ray's account of its death} for the ranks whose process has died.

        Every rank is pinged: a dead one's ping fails as soon as Ray knows the process is gone (about a
        second after it ended); a live one answers, or, busy in a long call (a collective), stays silent and
        after `wait_s` counts as alive.
        """
        refs = [h.ping.remote() for h in self._hosts]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=wait_s)
        dead = {}
        for rank, ref in enumerate(refs):
            if ref not in ready:
                continue
            try:
                ray.get(ref)
            except ray.exceptions.ActorDiedError as exc:
                dead[rank] = error_text(exc)
            except Exception:  # noqa: BLE001 - unreachable or restarting: not known dead
                continue
        return dead

    def shutdown(self) -> None:
        """Kill the worker processes (views of a colocated group share them)."""
        for host in self._hosts:
            ray.kill(host)


def _start_hosts(pool: RayResourcePool, options: dict, timeout_s: float) -> list:
    """One WorkerHost actor per bundle, in rank order (node by node)."""
    share = 1.0 / pool.max_colocate_count
    host_cls = ray.remote(WorkerHost)
    hosts = []
    for pg in pool.get_placement_groups(timeout_s):
        for index in range(pg.bundle_count):
            strategy = PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=index)
            actor_options = {"num_cpus": share, "scheduling_strategy": strategy, **options}
            if pool.use_gpu:
                actor_options["num_gpus"] = share
            hosts.append(host_cls.options(**actor_options).remote())
    return hosts


GROUP_ENV_KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                  "RLPOST_DEVICE")


def _rank_envs(hosts: list, pool: RayResourcePool, timeout_s: float) -> list[dict[str, str]]:
    """RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR/PORT, RLPOST_DEVICE and the driver per rank."""
    fetch = Gatherer("worker group", "node_ip_and_free_port", [0], timeout_s)
    master = fetch([hosts[0].node_ip_and_free_port.remote()])
    addr, port = master[0]
    envs = []
    for node_size in pool.store:
        for local in range(node_size):
            envs.append({
                "RANK": str(len(envs)),
                "WORLD_SIZE": str(pool.world_size),
                # On GPU, Ray sets CUDA_VISIBLE_DEVICES to the bundle's one GPU: it is device 0 in the process.
                "LOCAL_RANK": "0" if pool.use_gpu else str(local),
                "LOCAL_WORLD_SIZE": str(node_size),
                "MASTER_ADDR": addr,
                "MASTER_PORT": str(port),
                "RLPOST_DEVICE": pool.device,
                **driver_env(),
            })
    return envs
