"""Ray start-up and shut-down for the trainer (config group `ray_init`)."""

from __future__ import annotations

import os
from typing import Any, Mapping

import ray

# Worker processes need these; values set in the driver's environment win over the defaults.
DEFAULT_WORKER_ENV = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # the engine must live inside the worker process
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "HF_HUB_OFFLINE": "1",
}
_SUPPORTED_KEYS = {"num_cpus", "timeline_json_file"}


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


def init_ray(ray_init_cfg: Mapping | None = None, runtime_env: Mapping[str, Any] | None = None) -> None:
    """Start local Ray (ray_init.num_cpus; None = all cores) unless it is already running."""
    cfg = _check_keys(ray_init_cfg)
    if ray.is_initialized():
        return
    ray.init(
        num_cpus=cfg.get("num_cpus"),
        include_dashboard=False,
        log_to_driver=True,
        runtime_env=build_runtime_env(runtime_env),
    )


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
    return path or None
