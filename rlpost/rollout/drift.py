"""Drift between the rollout engine's sampling probabilities and the actor's (issue 5 §7)."""

from __future__ import annotations

import torch


def rollout_probs_diff(
    rollout_log_probs: torch.Tensor, actor_log_probs: torch.Tensor, response_mask: torch.Tensor
) -> dict[str, float]:
    """Absolute difference of token probabilities |exp(rollout) - exp(actor)| over masked tokens.

    Args:
        rollout_log_probs: (B,R) log-probs of the sampled tokens under the engine (temperature-scaled).
        actor_log_probs: (B,R) log-probs of the same tokens under the actor (logits / temperature).
        response_mask: (B,R) 1 on tokens that count.

    Returns:
        `training/rollout_probs_diff_mean`, `_max`, `_std` (population std); all 0.0 when the mask is empty.
    """
    mask = response_mask.bool()
    diff = (rollout_log_probs.float().exp() - actor_log_probs.float().exp()).abs()[mask]
    if diff.numel() == 0:
        mean = mx = std = 0.0
    else:
        mean, mx, std = diff.mean().item(), diff.max().item(), diff.std(unbiased=False).item()
    return {
        "training/rollout_probs_diff_mean": mean,
        "training/rollout_probs_diff_max": mx,
        "training/rollout_probs_diff_std": std,
    }
