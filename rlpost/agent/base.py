"""Agent loops: what one trajectory does between the engine and its environment.

An agent loop is an async class chosen per sample by name (`agent_name` column, else
`agent.default_agent_loop`) from `AGENT_LOOPS`. It gets an `AgentLoopContext` (tokenizer, the engine's
async `generate`, the settings, the tools and interactions) and its `run(sampling_params, **sample)`
returns one `AgentLoopOutput`.

The engine contract (`GenerateFn`):

    async def generate(prompt_ids: list[int], sampling_params: dict) -> tuple[list[int], list[float] | None]

`prompt_ids` is the whole conversation so far; `sampling_params` is the caller's dict plus `max_tokens`
(the remaining response budget). It returns the new token ids exactly as sampled, ending with the EOS
token when generation stopped on it, at most `max_tokens` of them, and their log-probs (same length)
or None.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from rlpost.utils.registry import Registry

if TYPE_CHECKING:
    from rlpost.agent.config import AgentLoopConfig
    from rlpost.interactions.base import BaseInteraction
    from rlpost.tools.base_tool import BaseTool

GenerateFn = Callable[[list[int], dict[str, Any]], Awaitable[tuple[list[int], "list[float] | None"]]]

AGENT_LOOPS = Registry("agent loop")


def register(name: str) -> Callable[[type], type]:
    """Class decorator adding an agent loop to AGENT_LOOPS under `name` (verl's decorator name)."""
    return AGENT_LOOPS.register(name)


@dataclass
class AgentLoopOutput:
    """One trajectory, unpadded.

    Attributes:
        prompt_ids: (P,) the templated prompt.
        response_ids: (R,) model tokens and tool/user tokens, R <= response_length.
        response_mask: (R,) 1 on model tokens, 0 on tool/user tokens.
        response_logprobs: (R,) the engine's log-probs, 0.0 on tool/user tokens; None if not given.
        num_turns: prompt + assistant turns + tool/user turns (verl's count).
        metrics: per-trajectory counters (see `metrics.py` for the names).
        reward_score: a score the loop computed itself, or None (the reward manager scores it).
        extra_fields: anything else (`turn_scores` of interactions, `tool_rewards`, `messages`).
    """

    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    response_logprobs: list[float] | None = None
    num_turns: int = 0
    metrics: dict[str, float] = field(default_factory=dict)
    reward_score: float | None = None
    extra_fields: dict[str, Any] = field(default_factory=dict)


@dataclass
class AgentLoopContext:
    """What every agent loop instance receives."""

    tokenizer: Any
    generate: GenerateFn
    config: AgentLoopConfig
    tools: dict[str, BaseTool] = field(default_factory=dict)
    interactions: dict[str, BaseInteraction] = field(default_factory=dict)
    trainer_config: Any = None  # read-only `actor_rollout_ref` + `data` view, for loops written against verl
    # what the loops of one call share (e.g. external_agent's HTTP endpoint); each `aclose()`d after the last loop
    services: dict[str, Any] = field(default_factory=dict)


class AgentLoopBase(abc.ABC):
    """Base of agent loops: one instance per trajectory.

    Args:
        context: shared tokenizer, engine, settings, tools and interactions.
        **kwargs: extra keys of the loop's entry in `agent_loop_config_path`.
    """

    def __init__(self, context: AgentLoopContext, **kwargs: Any) -> None:
        self.context = context
        self.tokenizer = context.tokenizer
        self.config = context.config
        self.tools = context.tools
        self.interactions = context.interactions
        self.kwargs = kwargs

    async def generate(
        self, prompt_ids: list[int], sampling_params: dict[str, Any], max_tokens: int
    ) -> tuple[list[int], list[float] | None]:
        """Call the engine for at most `max_tokens` new tokens (the caller's own `max_tokens`, if smaller,
        wins) and check its answer against the contract.

        Raises:
            TypeError / ValueError: the engine broke the contract (not a list of ints, log-probs of
                another length).
        """
        limit = min(max_tokens, int(sampling_params.get("max_tokens", max_tokens)))
        token_ids, log_probs = await self.context.generate(list(prompt_ids), {**sampling_params, "max_tokens": limit})
        token_ids = [int(t) for t in token_ids]
        if log_probs is not None:
            log_probs = [float(x) for x in log_probs]
            if len(log_probs) != len(token_ids):
                raise ValueError(f"generate returned {len(log_probs)} log-probs for {len(token_ids)} tokens")
        return token_ids, log_probs

    @abc.abstractmethod
    async def run(self, sampling_params: dict[str, Any], **sample: Any) -> AgentLoopOutput:
        """Run one trajectory.

        Args:
            sampling_params: engine sampling settings, passed to `generate`.
            **sample: the dataset row's fields (`raw_prompt`, `raw_prompt_ids`, `extra_info`,
                `tools_kwargs`, ...).
        """
