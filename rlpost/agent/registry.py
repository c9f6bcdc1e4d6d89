"""User agent loops from `agent.agent_loop_config_path`, and the check of a dataset's `agent_name`s.

    - name: my_agent
      _target_: my_pkg.agents.MyAgentLoop    # an AgentLoopBase subclass
      max_steps: 4                           # other keys: constructor keyword arguments
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Iterable

from rlpost.agent.base import AGENT_LOOPS, AgentLoopBase
from rlpost.tools.utils.yaml_entries import entry_error, import_class, load_entries


def _same_factory(a: Any, b: Any) -> bool:
    """Loading the same YAML twice registers equal factories: not a conflict."""
    if isinstance(a, functools.partial) and isinstance(b, functools.partial):
        return a.func is b.func and a.keywords == b.keywords and a.args == b.args
    return a is b


def load_agent_loops(agent_loop_config_path: str | Path) -> list[str]:
    """Register the file's loops in AGENT_LOOPS; returns their names.

    Raises:
        ConfigEntryError: unreadable file, missing name/_target_, unknown class, a class that is not an
            AgentLoopBase, or a name already registered to something else; the message names the entry.
    """
    names = []
    for index, entry in enumerate(load_entries(agent_loop_config_path, None)):
        name, target = entry.get("name"), entry.get("_target_")
        if not isinstance(name, str) or not name or not isinstance(target, str):
            raise entry_error(agent_loop_config_path, "file", index, "each entry needs 'name' and '_target_'")
        label = f"name {name!r}, _target_ {target!r}"
        try:
            cls = import_class(target)
        except ImportError as e:
            raise entry_error(agent_loop_config_path, "file", index, f"unknown agent loop class: {e}", label) from e
        if not (isinstance(cls, type) and issubclass(cls, AgentLoopBase)):
            raise entry_error(agent_loop_config_path, "file", index,
                              "the class must subclass rlpost.agent.base.AgentLoopBase", label)
        extra = {k: v for k, v in entry.items() if k not in ("name", "_target_")}
        check = getattr(cls, "check_options", None)  # loops that validate their options before anything starts
        if check is not None:
            try:
                check(**extra)
            except (TypeError, ValueError) as e:
                raise entry_error(agent_loop_config_path, "file", index, str(e), label) from e
        factory = functools.partial(cls, **extra) if extra else cls
        if name in AGENT_LOOPS and _same_factory(AGENT_LOOPS.get(name), factory):
            names.append(name)
            continue
        if name in AGENT_LOOPS and AGENT_LOOPS.get(name) is cls:
            # `@register(name)` on the class, and the YAML adds its keyword arguments (as verl lets it)
            AGENT_LOOPS._entries[name] = factory
            names.append(name)
            continue
        try:
            AGENT_LOOPS.register(name)(factory)
        except ValueError as e:
            raise entry_error(agent_loop_config_path, "file", index, str(e), label) from e
        names.append(name)
    return names


def check_agent_names(agent_names: Iterable[Any]) -> None:
    """Every distinct `agent_name` of a dataset must be registered (run before anything starts).

    Raises:
        ValueError: lists the unknown names and the registered ones.
    """
    unknown = sorted({str(n) for n in agent_names if n is not None and str(n) not in AGENT_LOOPS})
    if unknown:
        raise ValueError(f"agent_name values {unknown} are not registered agent loops; registered: "
                         f"{AGENT_LOOPS.names()} (add yours with "
                         "actor_rollout_ref.rollout.agent.agent_loop_config_path)")
