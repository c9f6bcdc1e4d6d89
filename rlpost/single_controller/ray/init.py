"""Ray start-up and shut-down for the trainer (config group `ray_init`)."""

from __future__ import annotations

import logging
import os
from contextlib import contextmanager
from typing import Any, Iterator, Mapping

import ray

from rlpost.single_controller.ray.diagnostics import LOG_DIR_ENV, QUIET_ENV
from rlpost.single_controller.ray.reaper import start_reaper

# Worker processes need these; values set in the driver's environment win over the defaults.
DEFAULT_WORKER_ENV = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # the engine must live inside the worker process
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "HF_HUB_OFFLINE": "1",
}
_SUPPORTED_KEYS = {"num_cpus", "timeline_json_file"}
_RLPOST_HANDLER = "_rlpost_handler"  # marks the handlers init_ray added to the "ray" logger
_reaper = None  # the process that ends Ray's processes if this one dies without shutting Ray down


def _check_keys(ray_init_cfg: Mapping | None) -> Mapping:
    cfg = ray_init_cfg or {}
    unknown = sorted(set(cfg.keys()) - _SUPPORTED_KEYS)
    if unknown:
        raise ValueError(f"not supported yet: ray_init.{unknown[0]} (supported: {sorted(_SUPPORTED_KEYS)})")
    return cfg


def build_runtime_env(runtime_env: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """`runtime_env` with env_vars = defaults < driver environment < the given env_vars."""
    env = dict(runtime_env or {})
    env_vars = {k: os.environ.get(k, v) for k, v in DEFAULT_WORKER_ENV.items()}
    env_vars.update(env.get("env_vars") or {})
    env["env_vars"] = {k: str(v) for k, v in env_vars.items()}
    return env


def init_ray(ray_init_cfg: Mapping | None = None, runtime_env: Mapping[str, Any] | None = None,
             log_dir: str | None = None, verbose: bool = True) -> None:
    """Start local Ray (ray_init.num_cpus; None = all cores) unless it is already running.

    Args:
        ray_init_cfg: the `ray_init` config group.
        runtime_env: extra runtime_env of the workers (env_vars merged over the defaults).
        log_dir: folder for the workers' stack dumps and, unless `verbose`, their output and Ray's own
            log lines (`ray_driver.log`); None leaves everything on the console.
        verbose: keep engine and Ray INFO output on the console (`trainer.verbose_engine_logs`).
    """
    cfg = _check_keys(ray_init_cfg)
    if ray.is_initialized():
        return
    env = dict(runtime_env or {})
    if log_dir is not None:
        env["env_vars"] = {**(env.get("env_vars") or {}), LOG_DIR_ENV: log_dir, QUIET_ENV: "0" if verbose else "1"}
    # An existing cluster (RAY_ADDRESS, e.g. several nodes started with `ray start`) has its resources already;
    # RAY_ADDRESS=local is Ray's word for "start one here" (never attach to a cluster this machine runs already).
    num_cpus = None if os.environ.get("RAY_ADDRESS", "") not in ("", "local") else cfg.get("num_cpus")
    runtime_env = build_runtime_env(env)
    kwargs = dict(num_cpus=num_cpus, include_dashboard=False, log_to_driver=True)
    inherited: dict[str, str] = {}
    if set(runtime_env) == {"env_vars"} and _starts_local_cluster():
        # A cluster started here inherits this process's environment: its workers get the variables without a
        # runtime_env, which would make Ray start every worker afresh instead of using the ones it pre-started.
        inherited = runtime_env["env_vars"]
    else:
        kwargs["runtime_env"] = runtime_env
    _start_reaper_once()
    with _environ(inherited):
        if verbose or log_dir is None:
            ray.init(**kwargs)
            return
        _init_quiet(kwargs, log_dir)


def _starts_local_cluster() -> bool:
    """Whether `ray.init()` here starts a cluster of its own (Ray's rule: no RAY_ADDRESS, no `ray start` one)."""
    try:  # a private Ray function: if it moves, fall back to the runtime_env path (slower start, same run)
        from ray._private.services import canonicalize_bootstrap_address

        return canonicalize_bootstrap_address(None) is None
    except Exception:  # noqa: BLE001
        return False


@contextmanager
def _environ(values: Mapping[str, str]) -> Iterator[None]:
    """`os.environ` updated with `values` inside the block, as it was after it."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _init_quiet(kwargs: dict[str, Any], log_dir: str) -> None:
    """`ray.init(**kwargs)` with Ray's INFO lines and warnings in `<log_dir>/ray_driver.log`, errors also on
    the console."""
    os.makedirs(log_dir, exist_ok=True)
    to_file = _handler(logging.FileHandler(os.path.join(log_dir, "ray_driver.log")), logging.INFO)
    # ray.init drops the handlers of the "ray" logger; what it logs meanwhile falls to logging.lastResort
    last_resort, logging.lastResort = logging.lastResort, to_file
    try:
        ray.init(configure_logging=False, **kwargs)
    finally:
        logging.lastResort = last_resort
    ray_logger = logging.getLogger("ray")
    ray_logger.setLevel(logging.INFO)
    ray_logger.propagate = False  # Ray's INFO and warnings go to the file, its errors to the console too
    ray_logger.addHandler(to_file)
    ray_logger.addHandler(_handler(logging.StreamHandler(), logging.ERROR))


def _start_reaper_once() -> None:
    """Ray's processes must not outlive this driver, even when it is killed (see `reaper`)."""
    global _reaper
    if _reaper is None:
        _reaper = start_reaper(os.getpid())


def _handler(handler: logging.Handler, level: int) -> logging.Handler:
    setattr(handler, _RLPOST_HANDLER, True)
    handler.setLevel(level)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    return handler


def finish_ray(ray_init_cfg: Mapping | None = None, shutdown: bool = True) -> str | None:
    """Write the Ray timeline to ray_init.timeline_json_file (if set), then shut Ray down.

    Returns:
        The timeline path, or None when none was asked for.
    """
    cfg = _check_keys(ray_init_cfg)
    path = cfg.get("timeline_json_file")
    if path and ray.is_initialized():
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        ray.timeline(filename=path)
    if shutdown and ray.is_initialized():
        ray.shutdown()
        _ray_logs_to_console()
    return path or None


def _ray_logs_to_console() -> None:
    """Remove the handlers a quiet `init_ray` added (a process may start Ray again, e.g. a test session)."""
    ray_logger = logging.getLogger("ray")
    for handler in [h for h in ray_logger.handlers if getattr(h, _RLPOST_HANDLER, False)]:
        ray_logger.removeHandler(handler)
        handler.close()
    ray_logger.propagate = True
