"""Padding agent-loop outputs into the batch fields a single-turn rollout produces (docs/design.md,
"Rollout"), so everything after generation treats both alike.

    prompts         (B, P)    left-padded with pad id
    responses       (B, R)    right-padded with pad id
    input_ids       (B, P+R)  prompts | responses
    attention_mask  (B, P+R)  1 on every real token, tool/user tokens included
    position_ids    (B, P+R)  prompt: 0.. over real tokens; response: continues from the last prompt position
    response_mask   (B, R)    1 on model tokens only (0 on tool/user tokens and padding)
    rollout_log_probs (B, R)  engine log-probs on model tokens, 0 elsewhere (only when every output has them)
"""

from __future__ import annotations

from typing import Sequence

import torch

from rlpost import keys
from rlpost.agent.base import AgentLoopOutput


def _right_pad(rows: Sequence[Sequence[float]], length: int, value: float, dtype: torch.dtype) -> torch.Tensor:
    out = torch.full((len(rows), length), value, dtype=dtype)
    for i, row in enumerate(rows):
        if len(row):
            out[i, : len(row)] = torch.as_tensor(list(row), dtype=dtype)
    return out


def collate_agent_outputs(
    outputs: Sequence[AgentLoopOutput], prompt_length: int, response_length: int, pad_token_id: int
) -> dict[str, torch.Tensor]:
    """Stack trajectories into padded tensors (keys from `rlpost.keys`, shapes in the module docstring).

    Args:
        outputs: B trajectories.
        prompt_length: P, at least the longest prompt (tool schemas in the system turn lengthen prompts).
        response_length: R, at least the longest response.
        pad_token_id: id written on padding.

    Raises:
        ValueError: a prompt or response longer than P or R, or a mask / log-probs of another length
            than its response.
    """
    for i, o in enumerate(outputs):
        if len(o.prompt_ids) > prompt_length:
            raise ValueError(f"trajectory {i}: prompt of {len(o.prompt_ids)} tokens exceeds prompt_length="
                             f"{prompt_length} (tool schemas are part of the prompt; raise data.max_prompt_length)")
        if len(o.response_ids) > response_length:
            raise ValueError(f"trajectory {i}: response of {len(o.response_ids)} tokens exceeds response_length="
                             f"{response_length}")
        if len(o.response_mask) != len(o.response_ids):
            raise ValueError(f"trajectory {i}: response_mask has {len(o.response_mask)} entries for "
                             f"{len(o.response_ids)} response tokens")
        if o.response_logprobs is not None and len(o.response_logprobs) != len(o.response_ids):
            raise ValueError(f"trajectory {i}: response_logprobs has {len(o.response_logprobs)} entries for "
                             f"{len(o.response_ids)} response tokens")
    # left padding = right padding of the reversed rows, flipped back
    prompts = _right_pad([o.prompt_ids[::-1] for o in outputs], prompt_length, pad_token_id, torch.long).flip(-1)
    prompt_attn = _right_pad([[1] * len(o.prompt_ids) for o in outputs], prompt_length, 0, torch.long).flip(-1)
    responses = _right_pad([o.response_ids for o in outputs], response_length, pad_token_id, torch.long)
    response_attn = _right_pad([[1] * len(o.response_ids) for o in outputs], response_length, 0, torch.long)
    response_mask = _right_pad([o.response_mask for o in outputs], response_length, 0, torch.long)
    prompt_pos = torch.clamp(prompt_attn.cumsum(-1) - 1, min=0)
    response_pos = prompt_pos[:, -1:] + torch.arange(1, response_length + 1, dtype=torch.long).unsqueeze(0)
    batch = {
        keys.PROMPTS: prompts,
        keys.RESPONSES: responses,
        keys.INPUT_IDS: torch.cat([prompts, responses], dim=-1),
        keys.ATTENTION_MASK: torch.cat([prompt_attn, response_attn], dim=-1),
        keys.POSITION_IDS: torch.cat([prompt_pos, response_pos], dim=-1),
        keys.RESPONSE_MASK: response_mask,
    }
    if outputs and all(o.response_logprobs is not None for o in outputs):
        lp = _right_pad([o.response_logprobs for o in outputs], response_length, 0.0, torch.float32)
        batch[keys.ROLLOUT_LOG_PROBS] = lp * response_mask.to(torch.float32)
    return batch
