"""`actor_rollout_ref.rollout.mode=async`: every prompt of a `generate_sequences` call enters the engine as its
own request at once, and each response is collected as it finishes.

The requests go through the engine's async front (`BaseRollout.agent_engine`, the one the agent loops use):
vLLM's continuous batching adds each request to the running batch and steps the engine; short responses
leave it early instead of waiting for the longest of a fixed batch. The output holds the same fields as the
sync path (`rlpost.rollout.utils.assemble_output`).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from rlpost import keys
from rlpost.rollout.async_engine import sampling_kwargs
from rlpost.rollout.base import resolve_sampling
from rlpost.rollout.utils import assemble_output, eos_id_set, prompt_token_lists

if TYPE_CHECKING:
    from rlpost.protocol import DataProto
    from rlpost.rollout.base import BaseRollout


def generate_concurrently(rollout: BaseRollout, prompts: DataProto) -> DataProto:
    """`rollout.generate_sequences(prompts)` with one concurrent request per row (see the module docstring).

    Reads and writes the keys `BaseRollout.generate_sequences` documents. Ranks whose engines step together
    (the HF engine under FSDP) keep taking part until every rank is done (`AgentEngine.close`).
    """
    spec = resolve_sampling(rollout.config, prompts.meta_info)
    engine = rollout.agent_engine(eos_id_set(prompts.meta_info.get(keys.META_EOS_TOKEN_ID)))
    params = sampling_kwargs(spec)

    async def _all() -> list:
        try:
            return await asyncio.gather(*(engine.generate(ids, params) for ids in prompt_token_lists(prompts)))
        finally:
            await engine.close()

    completions = asyncio.run(_all())
    log_probs = [lp for _, lp in completions] if spec.logprobs else None
    return assemble_output(prompts, [ids for ids, _ in completions], spec.max_tokens, log_probs)
