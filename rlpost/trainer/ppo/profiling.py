"""Which steps and roles are profiled, and with which tool: the trainer's side of `global_profiler`.

    global_profiler.tool=torch global_profiler.steps=[2] actor_rollout_ref.actor.profiler.enable=true

`trainer.profile_steps` (verl's older Nsight-only spelling) picks the steps when `global_profiler.steps` is
null, with `nsys` as the tool when `global_profiler.tool` is null. Files land under each role's
`profiler.save_path` (default `global_profiler.save_path`); see docs/profiling.md.
"""

from __future__ import annotations

import shutil
from contextlib import contextmanager
from typing import Any, Iterator

from rlpost.config.schema import PPOTrainerConfig
from rlpost.trainer.config.profiling_rules import (
    nsys_group,
    profile_steps,
    profile_tool,
    role_profilers,
    worker_nsight_options,
)
from rlpost.utils.profiler import ProfileOptions


def role_options(c: PPOTrainerConfig, role: str) -> ProfileOptions | None:
    """The resolved options of `role`, or None when it is not profiled."""
    tool, prof = profile_tool(c), role_profilers(c)[role]
    if tool is None or not prof.enable:
        return None
    ranks = None if prof.all_ranks else tuple(prof.ranks or [0])
    # the rollout's profiler has no `discrete` key: it runs in the actor's process and follows the actor's switch
    # (a step capture of its own would hold every phase of that process in one capture)
    switch = role_profilers(c)["actor"] if role == "rollout" else prof
    discrete = bool(switch.discrete)
    if (switch.tool or tool) == "nsys" and nsys_group(c).get("discrete"):  # verl's global switch for every role
        discrete = True
    return ProfileOptions(role=role, tool=prof.tool or tool, ranks=ranks,
                          save_path=str(prof.save_path or c.global_profiler.save_path), discrete=discrete,
                          contents=tuple(prof.tool_config["torch"]["contents"]),
                          max_entries=int(c.global_profiler.global_tool_config["torch_memory"]
                                          ["trace_alloc_max_entries"]))


def nsight_runtime_env(c: PPOTrainerConfig, options: dict[str, Any]) -> dict[str, Any]:
    """Ray actor `options` of the worker processes, plus an nsight runtime_env (workers start under nsys)
    when the tool is nsys; the options' own runtime_env entries are kept."""
    if profile_tool(c) != "nsys":
        return options
    nsight = worker_nsight_options(c)
    return {**options, "runtime_env": {**(options.get("runtime_env") or {}), "nsight": nsight}}


def check_profiler_tools(c: PPOTrainerConfig) -> None:
    """What the chosen tool needs from this machine (checked before Ray starts).

    Raises:
        ValueError: nsys is not on PATH (names the tool and the alternative).
    """
    if profile_tool(c) == "nsys" and profile_steps(c) and shutil.which("nsys") is None:
        raise ValueError("global_profiler.tool=nsys (or trainer.profile_steps) needs NVIDIA Nsight Systems, and "
                         "`nsys` is not on PATH: install it, or use global_profiler.tool=torch (a chrome trace per "
                         "rank, no extra tool)")


class ProfileSchedule:
    """Starts and stops the profiled roles of each worker group around the chosen steps.

    Args:
        c: the typed config. groups: {role name: the worker group (view) that runs it}; roles without a
            group (no critic, a reference inside the actor) are skipped.
    """

    def __init__(self, c: PPOTrainerConfig, groups: dict[str, Any]) -> None:
        self.steps = set(profile_steps(c))
        self.continuous = c.global_profiler.profile_continuous_steps
        self.active: list[tuple[Any, ProfileOptions]] = []
        for role, group in groups.items():
            options = role_options(c, role)
            if group is not None and options is not None:
                self.active.append((group, options))
        self.written: list[str] = []

    def _starts(self, step: int) -> bool:
        return step in self.steps and not (self.continuous and step - 1 in self.steps)

    def _stops(self, step: int, is_last: bool) -> bool:
        return step in self.steps and (is_last or not (self.continuous and step + 1 in self.steps))

    @contextmanager
    def step(self, step: int, is_last: bool = False) -> Iterator[None]:
        """Profile the block when `step` is chosen (a continuous run spans consecutive chosen steps)."""
        if self.active and self._starts(step):
            for group, options in self.active:
                group.start_profile(step, options)
        try:
            yield
        finally:
            if self.active and self._stops(step, is_last):
                written = [f for group, options in self.active for files in group.stop_profile(options.role)
                           for f in files]
                self.written.extend(written)
                print(f"[rlpost] profile of step {step}: {', '.join(written) or 'nsys writes its report'}")
