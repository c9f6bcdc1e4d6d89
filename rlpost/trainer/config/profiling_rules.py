"""Start-up rules of the profiling keys (`global_profiler.*`, each role's `profiler.*`) and of
`trainer.device_memory_gb`. What the chosen tool needs from the machine (nsys on PATH) is checked later,
before Ray starts (`rlpost.trainer.ppo.profiling.check_profiler_tools`)."""

from __future__ import annotations

from typing import Any

from rlpost.config.schema import PPOTrainerConfig
from rlpost.trainer.config.batch_rules import n_devices
from rlpost.trainer.config.errors import ConfigError, warn
from rlpost.trainer.config.rules import fail

TOOLS = ("torch", "torch_memory", "nsys")
ARR = "actor_rollout_ref"
ROLE_GROUPS = {"actor": f"{ARR}.actor", "ref": f"{ARR}.ref", "rollout": f"{ARR}.rollout", "critic": "critic",
               "reward_model": "reward_model"}


def profile_tool(c: PPOTrainerConfig) -> str | None:
    """The tool of the run: `global_profiler.tool`, else nsys when `trainer.profile_steps` is set."""
    if c.global_profiler.tool is not None:
        return c.global_profiler.tool
    return "nsys" if c.trainer.profile_steps else None


def profile_steps(c: PPOTrainerConfig) -> list[int]:
    """The steps to profile: `global_profiler.steps`, else `trainer.profile_steps`, else none."""
    return list(c.global_profiler.steps or c.trainer.profile_steps or [])


def role_profilers(c: PPOTrainerConfig) -> dict[str, Any]:
    """{role name: its `profiler` group} for every role that has one."""
    arr = c.actor_rollout_ref
    return {"actor": arr.actor.profiler, "ref": arr.ref.profiler, "rollout": arr.rollout.profiler,
            "critic": c.critic.profiler, "reward_model": c.reward_model.profiler}


def check_profiling(c: PPOTrainerConfig) -> None:
    """Tools are built ones, steps are step numbers, ranks exist, the tool suits the device."""
    memory = c.trainer.device_memory_gb
    if memory is not None and memory <= 0:
        fail(f"trainer.device_memory_gb={memory}", "must be a number of GiB > 0 or null", "trainer.device_memory_gb=80")
    tools = {"global_profiler.tool": c.global_profiler.tool}
    tools.update({f"{ROLE_GROUPS[r]}.profiler.tool": p.tool for r, p in role_profilers(c).items()})
    for key, tool in tools.items():
        if tool == "npu":
            raise ConfigError(f"not supported yet: {key}=npu (Ascend NPU profiling is not built); use {key}=torch.")
        if tool is not None and tool not in TOOLS:
            fail(f"{key}={tool}", f"must be one of {', '.join(TOOLS)} or null", f"{key}=torch")
    _nsight_options_agree(c)
    steps, tool = profile_steps(c), profile_tool(c)
    for step in steps:
        if not isinstance(step, int) or step < 1:
            fail(f"global_profiler.steps={steps}", "must list training steps (integers >= 1)",
                 "global_profiler.steps=[1]")
    if tool is None:
        return
    enabled = {r: p for r, p in role_profilers(c).items() if p.enable}
    used = {p.tool or tool for p in enabled.values()}
    if len(used) > 1:
        fail(", ".join(f"{ROLE_GROUPS[r]}.profiler.tool={p.tool or tool}" for r, p in enabled.items()),
             "colocated roles share one process and one capture: give them one tool", f"global_profiler.tool={tool}")
    if c.trainer.device == "cpu" and used & {"torch_memory", "nsys"}:
        bad = sorted(used & {"torch_memory", "nsys"})[0]
        fail(f"global_profiler.tool={bad}, trainer.device=cpu",
             f"{bad} records CUDA activity and a CPU run has none", "global_profiler.tool=torch")
    devices = n_devices(c)
    for role, prof in enabled.items():
        outside = [r for r in prof.ranks or [] if not 0 <= r < devices]
        if outside:
            fail(f"{ROLE_GROUPS[role]}.profiler.ranks={prof.ranks}", f"ranks must be in [0, {devices})",
                 f"{ROLE_GROUPS[role]}.profiler.ranks=[0]")
    if not steps:
        warn(f"global_profiler.tool={tool} without global_profiler.steps profiles nothing; set e.g. "
             f"global_profiler.steps=[1]")
    elif not enabled:
        warn(f"global_profiler.steps={steps}: no role has profiler.enable=true, so nothing is profiled; set e.g. "
             f"{ARR}.actor.profiler.enable=true")


NSYS_WORKER_OPTIONS = "global_profiler.global_tool_config.nsys.worker_nsight_options"
TRAINER_WORKER_OPTIONS = "trainer.worker_nsight_options"


def nsys_group(c: PPOTrainerConfig) -> dict[str, Any]:
    """verl's newer `global_profiler.global_tool_config.nsys` group ({} when absent)."""
    return dict(c.global_profiler.global_tool_config.get("nsys") or {})


def _nsight_str(value: Any) -> str:
    """nsys options are strings; Hydra reads `=true` as a bool, which nsys wants as `true`."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def _set_entries(options: Any, key: str) -> dict[str, Any]:
    """The entries of `options` (the group at `key`) set away from the package default."""
    from rlpost.trainer.config.defaults import default_of

    default = default_of(key) or {}
    return {k: v for k, v in dict(options or {}).items()
            if k not in default or _nsight_str(v) != _nsight_str(default[k])}


def worker_nsight_options(c: PPOTrainerConfig) -> dict[str, str]:
    """The workers' nsys options, as strings: `trainer.worker_nsight_options`, where each entry of verl's newer
    `global_profiler.global_tool_config.nsys.worker_nsight_options` set away from its default wins."""
    newer = _set_entries(nsys_group(c).get("worker_nsight_options"), NSYS_WORKER_OPTIONS)
    merged = {**dict(c.trainer.worker_nsight_options or {}), **newer}
    return {k: _nsight_str(v) for k, v in merged.items() if v is not None}


def _nsight_options_agree(c: PPOTrainerConfig) -> None:
    """An entry set away from its default in both `trainer.worker_nsight_options` and verl's newer
    `global_profiler.global_tool_config.nsys.worker_nsight_options` must have one value (the newer one is used)."""
    newer = _set_entries(nsys_group(c).get("worker_nsight_options"), NSYS_WORKER_OPTIONS)
    older = _set_entries(c.trainer.worker_nsight_options, TRAINER_WORKER_OPTIONS)
    for name in sorted(newer.keys() & older.keys()):
        if _nsight_str(newer[name]) != _nsight_str(older[name]):
            fail(f"{NSYS_WORKER_OPTIONS}.{name}={newer[name]}, {TRAINER_WORKER_OPTIONS}.{name}={older[name]}",
                 "two spellings of one nsys option disagree; set one of them",
                 f"{NSYS_WORKER_OPTIONS}.{name}={newer[name]}")
