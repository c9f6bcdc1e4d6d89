"""`tool_agent`: generate, run the tool calls the model made, feed their results back, repeat.

    prompt (with tool schemas) -> generate -> parse calls -> run <= max_parallel_calls of them
        -> tool messages -> generate -> ... until no call / max_assistant_turns / max_user_turns / budget

When the row carries `interaction_kwargs` (with `name`), a model turn without tool calls goes to that
interaction instead: its reply becomes the next user message, or it ends the conversation.
"""

from __future__ import annotations

import logging
from typing import Any
from uuid import uuid4

from rlpost.agent.base import AgentLoopBase, AgentLoopOutput, register
from rlpost.agent.metrics import TrajectoryStats
from rlpost.agent.samples import interaction_kwargs, prompt_messages, tools_kwargs
from rlpost.agent.tool_calls import ToolSession
from rlpost.agent.tool_parser import get_tool_parser
from rlpost.agent.trajectory import TrajectoryBuilder, truncate_tool_text
from rlpost.interactions.base import BaseInteraction

logger = logging.getLogger(__name__)


class _Conversation:
    """State of one trajectory while it runs."""

    def __init__(self, builder: TrajectoryBuilder, session: ToolSession, interaction: BaseInteraction | None,
                 interaction_kwargs: dict[str, Any], request_id: str) -> None:
        self.builder, self.session, self.interaction = builder, session, interaction
        self.interaction_kwargs, self.request_id = interaction_kwargs, request_id
        self.stats = TrajectoryStats()
        self.turn_scores: list[float] = []


@register("tool_agent")
class ToolAgentLoop(AgentLoopBase):
    """Multi-turn loop with tools (and optionally an interaction); see the module docstring."""

    def _interaction(self, kwargs: dict[str, Any]) -> BaseInteraction | None:
        if not kwargs:
            return None
        name = kwargs.get("name")
        if name not in self.interactions:
            raise ValueError(f"interaction_kwargs.name={name!r} is not a configured interaction; configured: "
                             f"{sorted(self.interactions)} (multi_turn.interaction_config_path)")
        return self.interactions[name]

    async def run(self, sampling_params: dict[str, Any], **sample: Any) -> AgentLoopOutput:
        cfg = self.config
        schemas = [tool.tool_schema.model_dump() for tool in self.tools.values()]
        builder = TrajectoryBuilder(self.tokenizer, prompt_messages(sample, "tool_agent"), cfg.response_length,
                                    schemas, cfg.template_kwargs)
        i_kwargs = interaction_kwargs(sample)
        conv = _Conversation(builder, ToolSession(self.tools, tools_kwargs(sample), cfg.tool_timeout_s),
                             self._interaction(i_kwargs), i_kwargs, uuid4().hex)
        if conv.interaction is not None:
            await conv.interaction.start_interaction(conv.request_id, **i_kwargs)
        try:
            await self._converse(conv, sampling_params)
        finally:
            tool_rewards = await conv.session.close()
            if conv.interaction is not None:
                await conv.interaction.finalize_interaction(conv.request_id)
        traj = builder.result(cfg.tokenization_sanity_check_mode)
        conv.stats.truncated = traj.truncated
        conv.stats.tokenization_mismatch = not traj.sanity.ok
        if not traj.sanity.ok:
            logger.warning(traj.sanity.describe())
        return AgentLoopOutput(
            prompt_ids=traj.prompt_ids, response_ids=traj.response_ids, response_mask=traj.response_mask,
            response_logprobs=traj.response_logprobs, num_turns=conv.stats.num_turns,
            metrics=conv.stats.as_metrics(),
            extra_fields={"turn_scores": conv.turn_scores, "tool_rewards": tool_rewards,
                          "step_rewards": list(conv.session.step_rewards), "messages": traj.messages},
        )

    def _turn_limit_reached(self, stats: TrajectoryStats) -> bool:
        cfg = self.config
        return bool((cfg.max_assistant_turns and stats.assistant_turns >= cfg.max_assistant_turns)
                    or (cfg.max_user_turns and stats.user_turns >= cfg.max_user_turns))

    async def _converse(self, conv: _Conversation, sampling_params: dict[str, Any]) -> None:
        builder, stats = conv.builder, conv.stats
        parse = get_tool_parser(self.config.format)
        while True:
            ids, log_probs = await self.generate(builder.prompt_ids + builder.response_ids, sampling_params,
                                                 builder.remaining)
            builder.add_model_turn(ids, log_probs)
            # formats such as gpt-oss, llama3 and mistral mark calls with special tokens
            parsed = parse(builder.last_turn_raw)
            stats.assistant_turns += 1
            stats.bad_tool_calls += parsed.num_bad
            if builder.truncated or self._turn_limit_reached(stats):
                return
            if parsed.calls:
                messages = await self._tool_messages(conv, parsed.calls[: self.config.max_parallel_calls])
            elif conv.interaction is not None:
                done, text, score, _ = await conv.interaction.generate_response(
                    conv.request_id, [dict(m) for m in builder.messages], **conv.interaction_kwargs
                )
                stats.interaction_turns += 1
                conv.turn_scores.append(float(score))
                if done:  # the reply is not appended: the response ends on the model's tokens
                    return
                messages = [{"role": "user", "content": text}]
            else:
                return
            if not builder.add_messages(messages):
                return
            stats.user_turns += 1

    async def _tool_messages(self, conv: _Conversation, calls: list) -> list[dict[str, Any]]:
        """Run the calls; one tool message per call, in call order, each cut to max_tool_response_length."""
        cfg = self.config
        results = await conv.session.run(calls)
        conv.stats.tool_calls += len(results)
        conv.stats.tool_errors += sum(r.failed for r in results)
        return [
            {"role": "tool", "content": truncate_tool_text(self.tokenizer, r.text, cfg.max_tool_response_length,
                                                           cfg.tool_response_truncate_side)}
            for r in results
        ]
