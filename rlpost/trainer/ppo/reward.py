"""verl's `verl.trainer.ppo.reward` names, for recipes that build their own reward functions."""

from __future__ import annotations

from typing import Any

import torch

from rlpost.protocol import DataProto
from rlpost.reward import load_reward_manager

__all__ = ["compute_reward", "load_reward_manager"]


def compute_reward(data: DataProto, reward_fn: Any) -> tuple[torch.Tensor, dict[str, list]]:
    """(`token_level_scores` (B, R), {extra field: one value per row}) of `reward_fn` on `data`."""
    result = reward_fn(data, return_dict=True)
    return result["reward_tensor"], dict(result.get("reward_extra_info") or {})
