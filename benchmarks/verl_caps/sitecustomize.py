"""Per-sample response caps for verl's rollout: the same work as rlpost's on the GSM8K-shaped workload.

Put this folder first on PYTHONPATH of the verl side run (`benchmarks/verl_side.py run` does): Python imports
`sitecustomize` at start-up in every process, Ray's workers too. It changes nothing until verl's agent-loop module
is imported; then `AgentLoopWorker._run_agent_loop` (one call per sample, in verl 0.9.1's v1 trainer and its
legacy one) asks the engine for `max_tokens` = the sample's cap from the dataset row's `extra_info.response_caps`.
The j-th sample of a prompt takes caps[j % len(caps)], at most `rollout.response_length`: rlpost's rule
(`rlpost.rollout.utils.row_caps`). verl's vLLM server honours a request's `max_tokens`
(`vLLMHttpServer.generate`). With `rollout.ignore_eos=True` on both sides every sample then runs exactly to its
cap, so both frameworks generate and train on the same token counts; `benchmarks/verl_c3.py` checks that from
both runs' logs.

Validation requests are left alone. Each patched process prints one `[verl_caps]` line (the check looks for it).
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

TARGET = "verl.experimental.agent_loop.agent_loop"
MARK = "[verl_caps]"


def sample_cap(extra_info: Mapping[str, Any] | None, j: int, limit: int) -> int | None:
    """The cap of the j-th sample of a prompt whose row has `extra_info` (None: the row has no caps)."""
    caps: Sequence[Any] | None = (extra_info or {}).get("response_caps")
    if caps is None or len(caps) == 0:
        return None
    return min(int(list(caps)[j % len(caps)]), int(limit))


def _response_length(worker: Any) -> int:
    try:
        return int(worker.config.actor_rollout_ref.rollout.response_length)
    except (AttributeError, TypeError, ValueError):
        return int(worker.rollout_config.response_length)


def patch(module: Any) -> None:
    """Wrap `module.AgentLoopWorker._run_agent_loop` (the module: verl's agent-loop module, just executed)."""
    cls = module.AgentLoopWorker
    original = cls._run_agent_loop
    if getattr(original, "_verl_caps", False):
        return

    @functools.wraps(original)
    async def _run_agent_loop(self: Any, sampling_params: dict[str, Any], trajectory: dict[str, Any], *args: Any,
                              **kwargs: Any) -> Any:
        if not trajectory.get("validate", False):
            # v1 trainer: one call per session of a prompt (session_id = j); legacy trainer: rows repeated
            # in place, rollout_n = j
            j = kwargs.get("session_id", trajectory.get("rollout_n", 0))
            cap = sample_cap(kwargs.get("extra_info"), int(j), _response_length(self))
            if cap is not None:
                sampling_params = {**sampling_params, "max_tokens": cap}
        return await original(self, sampling_params, trajectory, *args, **kwargs)

    _run_agent_loop._verl_caps = True  # type: ignore[attr-defined]
    cls._run_agent_loop = _run_agent_loop
    print(f"{MARK} per-sample response caps on {cls.__name__}._run_agent_loop (pid {os.getpid()})",
          file=sys.stderr, flush=True)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds TARGET as the path finder would, and runs `patch` right after the module's own code."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            run(module)
            patch(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def _run_shadowed() -> None:
    """Run the `sitecustomize` this one shadows (the next on sys.path), if any: the host's start-up stays as it was."""
    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        path = os.path.join(entry or ".", "sitecustomize.py")
        if os.path.abspath(entry or ".") != here and os.path.isfile(path):
            spec = importlib.util.spec_from_file_location("_shadowed_sitecustomize", path)
            if spec is not None and spec.loader is not None:
                spec.loader.exec_module(importlib.util.module_from_spec(spec))
            return


if not any(isinstance(f, _AfterImport) for f in sys.meta_path):
    sys.meta_path.insert(0, _AfterImport())
    if __name__ == "sitecustomize":
        _run_shadowed()
