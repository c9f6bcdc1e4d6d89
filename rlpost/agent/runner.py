"""Running a batch of trajectories concurrently on one asyncio event loop.

Every trajectory is its own task, so while some wait on tools (or on an interaction) the others keep
sending requests to the engine; how those requests are batched is the engine adapter's business.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Sequence

from rlpost.agent import external, single_turn, tool_agent  # noqa: F401  (registers the built-in loops)
from rlpost.agent.base import AGENT_LOOPS, AgentLoopContext, AgentLoopOutput, GenerateFn
from rlpost.agent.config import AgentLoopConfig
from rlpost.agent.registry import check_agent_names, load_agent_loops
from rlpost.agent.samples import agent_name, interaction_kwargs
from rlpost.interactions.base import BaseInteraction
from rlpost.interactions.utils.interaction_registry import interactions_by_name
from rlpost.rollout.over_sample import OverSampled, gather_first_groups
from rlpost.tools.base_tool import BaseTool
from rlpost.tools.utils.tool_registry import tools_by_name


@dataclass
class AgentResources:
    """Tools and interactions of the process, built once from the config's YAML files (the user agent
    loops of `agent_loop_config_path` are registered at the same time)."""

    tools: dict[str, BaseTool] = field(default_factory=dict)
    interactions: dict[str, BaseInteraction] = field(default_factory=dict)

    @classmethod
    def from_config(cls, config: AgentLoopConfig) -> AgentResources:
        """Raises ConfigEntryError naming the YAML entry that is wrong."""
        if config.agent_loop_config_path:
            load_agent_loops(config.agent_loop_config_path)
        check_agent_names([config.default_agent_loop])
        return cls(tools_by_name(config.tool_config_path), interactions_by_name(config.interaction_config_path))


def check_samples(samples: Sequence[dict[str, Any]], config: AgentLoopConfig, resources: AgentResources) -> None:
    """Agent and interaction names of every row exist, before any trajectory starts.

    Raises:
        ValueError: an unregistered `agent_name` or an unknown `interaction_kwargs.name`.
    """
    check_agent_names(agent_name(s, config.default_agent_loop) for s in samples)
    wanted = {interaction_kwargs(s).get("name") for s in samples if interaction_kwargs(s)}
    unknown = sorted(str(n) for n in wanted if n not in resources.interactions)
    if unknown:
        raise ValueError(f"interaction_kwargs.name values {unknown} are not configured interactions; configured: "
                         f"{sorted(resources.interactions)} (multi_turn.interaction_config_path)")


async def run_agent_loops(
    samples: Sequence[dict[str, Any]],
    generate: GenerateFn,
    config: AgentLoopConfig,
    tokenizer: Any,
    sampling_params: dict[str, Any] | None = None,
    resources: AgentResources | None = None,
    trainer_config: Any = None,
    first_groups: tuple[Sequence[Any], int] | None = None,
) -> list[AgentLoopOutput] | OverSampled:
    """Run one agent loop per row, all at once; outputs in row order.

    Args:
        samples: dataset rows (dicts of their non-tensor fields: `raw_prompt`, `raw_prompt_ids`,
            `agent_name`, `extra_info`, `tools_kwargs`, ...).
        generate: the engine's async generate (contract in `rlpost.agent.base`).
        config: agent-loop settings.
        tokenizer: HF tokenizer with the chat template.
        sampling_params: passed to every `generate` call (plus `max_tokens`); None: {}.
        resources: tools and interactions; None: built from `config` (once per call).
        trainer_config: what loops written against verl read as `self.config` (see
            `rlpost.experimental.agent_loop`); None when no such loop runs.
        first_groups: (uids (B,), keep) for `rollout.over_sample_rate`: once `keep` groups (rows sharing a uid)
            have every trajectory finished, the others are cancelled (their engine requests aborted, their tools
            released) and an `OverSampled` is returned: the outputs, None on the rows of cut groups, and the
            per-row cut / aborted flags (`rlpost.rollout.over_sample.gather_first_groups`).

    Raises:
        ValueError: a row names an unknown agent loop or interaction (nothing has run yet).
    """
    resources = resources if resources is not None else AgentResources.from_config(config)
    check_samples(samples, config, resources)
    context = AgentLoopContext(tokenizer, generate, config, resources.tools, resources.interactions, trainer_config)
    params = dict(sampling_params or {})

    async def one(sample: dict[str, Any]) -> AgentLoopOutput:
        loop = AGENT_LOOPS.get(agent_name(sample, config.default_agent_loop))(context)
        return await loop.run(dict(params), **sample)

    if first_groups is not None:
        uids, keep = first_groups
        try:  # gather_first_groups cancels the rest of the call when one trajectory fails
            return await gather_first_groups([one(dict(s)) for s in samples], list(uids), keep)
        finally:
            for service in context.services.values():
                await service.aclose()
    tasks = [asyncio.ensure_future(one(dict(s))) for s in samples]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        # one trajectory failed (or the caller cancelled): stop the others so their tools get released
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    finally:
        for service in context.services.values():
            await service.aclose()
