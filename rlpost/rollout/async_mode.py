"""`actor_rollout_ref.rollout.mode=async`: every prompt of a `generate_sequences` call enters the engine as its
own request at once, and each response is collected as it finishes.

The requests go through the engine's async front (`BaseRollout.agent_engine`, the one the agent loops use):
vLLM's continuous batching adds each request to the running batch and steps the engine; short responses
leave it early instead of waiting for the longest of a fixed batch. The output holds the same fields as the
sync path (`rlpost.rollout.utils.assemble_output`). With `rollout.over_sample_rate` > 0 (training batches only)
the slowest groups are aborted once enough are done (`rlpost.rollout.over_sample`): their rows come back with an
empty response and the per-row flags `over_sample_cut` / `over_sample_aborted`, which the trainer reads and drops.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import numpy as np

from rlpost import keys
from rlpost.rollout.async_engine import sampling_kwargs
from rlpost.rollout.over_sample import gather_first_groups, groups_to_keep
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
    rate = 0.0 if prompts.meta_info.get(keys.META_VALIDATE) else float(rollout.config.over_sample_rate)
    uids = prompts.non_tensor_batch.get(keys.UID) if rate > 0 else None
    outcome = None

    async def _all() -> list:
        nonlocal outcome
        requests = [engine.generate(ids, params) for ids in prompt_token_lists(prompts)]
        try:
            if uids is None:
                return await asyncio.gather(*requests)
            outcome = await gather_first_groups(requests, list(uids), groups_to_keep(len(set(uids)), rate))
            empty = ([], [] if spec.logprobs else None)
            return [empty if r is None else r for r in outcome.results]
        finally:
            await engine.close()

    completions = asyncio.run(_all())
    log_probs = [lp for _, lp in completions] if spec.logprobs else None
    out = assemble_output(prompts, [ids for ids, _ in completions], spec.max_tokens, log_probs)
    if outcome is not None:
        out.non_tensor_batch[keys.OVER_SAMPLE_CUT] = np.array(outcome.cut, dtype=bool)
        out.non_tensor_batch[keys.OVER_SAMPLE_ABORTED] = np.array(outcome.aborted, dtype=bool)
    return out
