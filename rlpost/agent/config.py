"""`AgentLoopConfig`: the settings the agent loops read, taken from `actor_rollout_ref.rollout`
(`multi_turn.*`, `agent.*`, `response_length`) and validated once. Built directly (agent loops used
without the trainer), a field left out takes its default from the packaged YAML, as the trainer's does."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rlpost.config.defaults import default_of

from rlpost.agent.sanity import SANITY_CHECK_MODES
from rlpost.agent.tool_parser import TOOL_PARSERS
from rlpost.agent.trajectory import TRUNCATE_SIDES

DEFAULT_AGENT_LOOP = "single_turn_agent"
# Rows without `agent_name` when tools or an interaction are configured (and agent.default_agent_loop is null).
TOOL_AGENT_LOOP = "tool_agent"


def default_agent_loop(configured: str | None, tool_config_path: str | None,
                       interaction_config_path: str | None) -> str:
    """Loop of rows without `agent_name`: `agent.default_agent_loop` when set, else `tool_agent` when a tools
    or interaction YAML is configured, else `single_turn_agent`."""
    if configured:
        return configured
    return TOOL_AGENT_LOOP if tool_config_path or interaction_config_path else DEFAULT_AGENT_LOOP


def _yaml(key: str) -> Any:
    """Default factory: the packaged YAML's value of `actor_rollout_ref.rollout.<key>`."""
    return field(default_factory=lambda: default_of(f"actor_rollout_ref.rollout.{key}"))


def _check_choice(key: str, value: Any, choices: tuple[str, ...] | list[str]) -> None:
    if value not in choices:
        raise ValueError(f"actor_rollout_ref.rollout.{key}={value!r}: must be one of {list(choices)}")


def _check_positive(key: str, value: Any, allow_none: bool) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        rule = "a positive int or null" if allow_none else "a positive int"
        raise ValueError(f"actor_rollout_ref.rollout.{key}={value!r}: must be {rule}")


@dataclass(frozen=True)
class AgentLoopConfig:
    """Settings of the agent loops; defaults are rollout.yaml's (verl's).

    Attributes:
        response_length: token budget of the whole response, all turns together.
        max_assistant_turns: model turns per trajectory (None: no limit but the budget).
        max_user_turns: tool-result and interaction turns per trajectory (None: no limit).
        max_parallel_calls: tool calls run per model turn; later calls of the same turn are dropped.
        max_tool_response_length: tokens kept of one tool response.
        tool_response_truncate_side: left (keep the start), middle or right (keep the end).
        tokenization_sanity_check_mode: strict, ignore_strippable or disable.
        format: tool-call format of the model's output (a TOOL_PARSERS name).
        tool_timeout_s: seconds one tool call may take unless the tool's config sets `timeout`.
        default_agent_loop: loop for samples without `agent_name`.
        tool_config_path / interaction_config_path / agent_loop_config_path: the YAML files, or None.
        template_kwargs: extra `apply_chat_template` arguments (data.apply_chat_template_kwargs).
    """

    response_length: int
    max_assistant_turns: int | None = _yaml("multi_turn.max_assistant_turns")
    max_user_turns: int | None = _yaml("multi_turn.max_user_turns")
    max_parallel_calls: int = _yaml("multi_turn.max_parallel_calls")
    max_tool_response_length: int = _yaml("multi_turn.max_tool_response_length")
    tool_response_truncate_side: str = _yaml("multi_turn.tool_response_truncate_side")
    tokenization_sanity_check_mode: str = _yaml("multi_turn.tokenization_sanity_check_mode")
    format: str = _yaml("multi_turn.format")
    tool_timeout_s: float = _yaml("multi_turn.tool_timeout_s")
    default_agent_loop: str = DEFAULT_AGENT_LOOP
    tool_config_path: str | None = _yaml("multi_turn.tool_config_path")
    interaction_config_path: str | None = _yaml("multi_turn.interaction_config_path")
    agent_loop_config_path: str | None = _yaml("agent.agent_loop_config_path")
    template_kwargs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _check_positive("response_length", self.response_length, False)
        _check_positive("multi_turn.max_assistant_turns", self.max_assistant_turns, True)
        _check_positive("multi_turn.max_user_turns", self.max_user_turns, True)
        _check_positive("multi_turn.max_parallel_calls", self.max_parallel_calls, False)
        _check_positive("multi_turn.max_tool_response_length", self.max_tool_response_length, False)
        _check_choice("multi_turn.tool_response_truncate_side", self.tool_response_truncate_side, TRUNCATE_SIDES)
        _check_choice("multi_turn.tokenization_sanity_check_mode", self.tokenization_sanity_check_mode,
                      SANITY_CHECK_MODES)
        _check_choice("multi_turn.format", self.format, TOOL_PARSERS.names())
        if not self.tool_timeout_s > 0:
            raise ValueError(f"tool_timeout_s={self.tool_timeout_s!r}: must be > 0 seconds")

    @classmethod
    def from_rollout_config(cls, rollout: Any, template_kwargs: dict[str, Any] | None = None) -> AgentLoopConfig:
        """Read `rollout.response_length`, `rollout.multi_turn.*` and `rollout.agent.*` (a typed
        `RolloutConfig` or the DictConfig node); deprecated aliases are resolved by the config validator
        before this point. `agent.default_agent_loop: null` means `tool_agent` when a tools or interaction
        YAML is configured, else `single_turn_agent`."""
        mt, agent = rollout.multi_turn, rollout.agent
        default_loop = default_agent_loop(agent.default_agent_loop, mt.tool_config_path, mt.interaction_config_path)
        return cls(
            response_length=int(rollout.response_length),
            max_assistant_turns=mt.max_assistant_turns,
            max_user_turns=mt.max_user_turns,
            max_parallel_calls=mt.max_parallel_calls,
            max_tool_response_length=mt.max_tool_response_length,
            tool_response_truncate_side=mt.tool_response_truncate_side,
            tokenization_sanity_check_mode=mt.tokenization_sanity_check_mode,
            format=mt.format,
            tool_timeout_s=float(mt.tool_timeout_s),
            default_agent_loop=default_loop,
            tool_config_path=mt.tool_config_path,
            interaction_config_path=mt.interaction_config_path,
            agent_loop_config_path=agent.agent_loop_config_path,
            template_kwargs=dict(template_kwargs or {}),
        )
