"""`single_turn_agent`: one generation, no tools - the agent-loop form of a plain rollout."""

from __future__ import annotations

from typing import Any

from rlpost import keys
from rlpost.agent.base import AgentLoopBase, AgentLoopOutput, register
from rlpost.agent.metrics import TrajectoryStats
from rlpost.agent.samples import prompt_messages
from rlpost.agent.trajectory import encode, render


@register("single_turn_agent")
class SingleTurnAgentLoop(AgentLoopBase):
    """Generates one response to the row's prompt: `raw_prompt_ids` when the row has them (the exact ids
    a single-turn rollout would use), else `raw_prompt` rendered with the chat template."""

    async def run(self, sampling_params: dict[str, Any], **sample: Any) -> AgentLoopOutput:
        raw_ids = sample.get(keys.RAW_PROMPT_IDS)
        if raw_ids is not None:
            prompt_ids = [int(t) for t in raw_ids]
        else:
            text = render(self.tokenizer, prompt_messages(sample, "single_turn_agent"), None, True,
                          self.config.template_kwargs)
            prompt_ids = encode(self.tokenizer, text)
        budget = self.config.response_length
        token_ids, log_probs = await self.generate(prompt_ids, sampling_params, budget)
        truncated = len(token_ids) > budget or (
            len(token_ids) == budget and (not token_ids or token_ids[-1] != self.tokenizer.eos_token_id)
        )
        token_ids = token_ids[:budget]
        stats = TrajectoryStats(assistant_turns=1, truncated=truncated)
        return AgentLoopOutput(
            prompt_ids=prompt_ids,
            response_ids=token_ids,
            response_mask=[1] * len(token_ids),
            response_logprobs=None if log_probs is None else log_probs[:budget],
            num_turns=stats.num_turns,
            metrics=stats.as_metrics(),
        )
