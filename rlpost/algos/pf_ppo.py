"""Policy-filtered PPO re-weighting (`algorithm.use_pf_ppo`): resample the batch by score.

Rows are drawn with replacement, with probability proportional to a weight of their sequence score,
so the update sees high-signal samples more often (PF-PPO, Zhang et al. 2024).
"""

from __future__ import annotations

from typing import Any

import torch

from rlpost import keys

PF_PPO_METHODS = ("pow", "max_min", "max_random")


def pf_ppo_weights(scores: torch.Tensor, method: str, weight_pow: float = 2.0) -> torch.Tensor:
    """Unnormalised sampling weight per row.

    pow: |s|^weight_pow. max_min: 1 for rows at the batch max or min score, else 0.
    max_random: 0.4 for rows at the max score, 0.1 for the others.

    Args:
        scores: (B,) sequence scores. method: one of PF_PPO_METHODS. weight_pow: exponent for pow.

    Returns:
        (B,) float weights.
    """
    s = scores.float()
    if method == "pow":
        return s.abs().pow(weight_pow)
    if method == "max_min":
        return ((s == s.max()) | (s == s.min())).float()
    if method == "max_random":
        return torch.where(s == s.max(), 0.4, 0.1)
    raise ValueError(f"algorithm.pf_ppo.reweight_method={method!r} is invalid: must be one of {list(PF_PPO_METHODS)}")


def pf_ppo_sample_indices(
    scores: torch.Tensor, method: str, weight_pow: float = 2.0, generator: torch.Generator | None = None
) -> torch.Tensor:
    """B row indices drawn with replacement, P(row) = weight / sum(weights).

    If every weight is 0 (e.g. pow with all-zero scores) the draw is uniform.

    Args:
        scores: (B,) sequence scores. method, weight_pow: see `pf_ppo_weights`.
        generator: torch RNG for reproducible draws.

    Returns:
        (B,) long indices into the batch.
    """
    weights = pf_ppo_weights(scores, method, weight_pow)
    if not torch.isfinite(weights).all() or weights.sum() <= 0:
        weights = torch.ones_like(weights)
    return torch.multinomial(weights, scores.shape[0], replacement=True, generator=generator)


def compute_pf_ppo_reweight_data(
    data: Any, reweight_method: str = "pow", weight_pow: float = 2.0, generator: torch.Generator | None = None
) -> Any:
    """Resampled copy of a DataProto; scores = row sums of `token_level_scores`.

    Reads `token_level_scores`; returns `data.select_idxs(indices)` (all fields, rows resampled).
    """
    scores = data.batch[keys.TOKEN_LEVEL_SCORES].sum(dim=-1)
    return data.select_idxs(pf_ppo_sample_indices(scores, reweight_method, weight_pow, generator))
