"""verl's optimal token baseline (`algorithm.adv_estimator=optimal_token_baseline`, and
`tir_optimal_token_baseline` for multi-turn rows): a per-token baseline from the group's returns weighted by the
squared norm of each token's score function (the actor's log-prob pass adds sum_v p(v)^2 per token).

Shapes: B = batch rows (prompts x n responses), R = response length. Registered with the other estimators
(`rlpost.algos.advantages`, which imports this module).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from rlpost.algos.advantages import AdvantageEstimator, EstimatorNeeds, _group_ids, register_adv_est


def _otb_weights(response_mask: torch.Tensor, old_log_probs: torch.Tensor | None,
                 sum_pi_squared: torch.Tensor | None, rollout_is_weights: torch.Tensor | None) -> torch.Tensor:
    """W_t = sum_{j<=t} w_j, w_j = 1 - 2 pi_j + sum_v pi(v)^2 (the squared norm of the score function of token j
    w.r.t. the logits), times rho_j^2 with rollout importance weights; (B, R), cumulated over valid tokens."""
    if old_log_probs is None or sum_pi_squared is None:
        raise ValueError("optimal_token_baseline needs the actor's old_log_probs and sum_pi_squared (B, R): set "
                         "actor_rollout_ref.actor.calculate_sum_pi_squared=true")
    w = 1.0 - 2.0 * old_log_probs.float().exp() + sum_pi_squared.float()
    if rollout_is_weights is not None:
        w = w * rollout_is_weights.float() ** 2
    return (w * response_mask).cumsum(dim=-1)


def _otb_baseline(returns: torch.Tensor, w_cum: torch.Tensor, mask: torch.Tensor, gid: torch.Tensor,
                  zero_tail: bool, epsilon: float) -> torch.Tensor:
    """Per group and position t: B_t = sum_i G_i,t W_i,t / sum_i W_i,t over the group's rows valid at t (rows of
    (B, T) tensors, left-aligned). A group of one has no baseline. With `zero_tail` the part of a group's single
    longest row past the second-longest one has no baseline either (no other row estimates it)."""
    baselines = torch.zeros_like(returns)
    lengths = mask.sum(-1)
    for g in torch.unique(gid):
        rows = (gid == g).nonzero(as_tuple=True)[0]
        if rows.numel() < 2:
            continue
        w = w_cum[rows] * mask[rows]
        baselines[rows] = ((returns[rows] * w).sum(0) / (w.sum(0) + epsilon)).to(baselines.dtype)
        if zero_tail:
            ordered = torch.sort(lengths[rows]).values
            longest = (lengths[rows] == ordered[-1]).nonzero(as_tuple=True)[0]
            if longest.numel() == 1 and ordered[-1] > ordered[-2]:
                baselines[rows[longest[0]], int(ordered[-2]):] = 0.0
    return baselines


@register_adv_est(AdvantageEstimator.OPTIMAL_TOKEN_BASELINE, EstimatorNeeds(groups=True, sum_pi_squared=True))
def compute_optimal_token_baseline_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    old_log_probs: torch.Tensor | None = None,
    sum_pi_squared: torch.Tensor | None = None,
    rollout_is_weights: torch.Tensor | None = None,
    handle_zero_tail: bool = True,
    otb_epsilon: float = 1e-8,
    by_trained_token: bool = False,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Optimal token baseline (OTB): a baseline per prompt group and response position instead of one per row.

    G_t = reward-to-go of row i from position t; W_t = the row's cumulative score-function energy up to t
    (`_otb_weights`); B_t = sum_i G_i,t W_i,t / sum_i W_i,t over the group; A_t = G_t - B_t. The returns are G.
    Needs `old_log_probs` and `sum_pi_squared` from the actor (`actor.calculate_sum_pi_squared=true`); uses
    `rollout_is_weights` when rollout correction made them. `otb_epsilon` keeps the division finite (verl's
    1e-8; not the uniform call's `epsilon`, GRPO's 1e-6, which would swamp W_t where the policy is near-certain).
    `by_trained_token`: position t is the row's t-th trained token (`tir_optimal_token_baseline`).
    """
    with torch.no_grad():
        mask = response_mask.to(torch.float32)
        returns = (token_level_rewards * mask).flip(-1).cumsum(-1).flip(-1)
        w_cum = _otb_weights(mask, old_log_probs, sum_pi_squared, rollout_is_weights)
        gid = _group_ids(index, token_level_rewards.shape[0]).to(returns.device)
        if not by_trained_token:
            baselines = _otb_baseline(returns, w_cum, mask, gid, handle_zero_tail, otb_epsilon)
            return (returns - baselines) * mask, returns
        valid = response_mask.bool()
        lengths = valid.sum(-1)
        width = int(lengths.max()) if lengths.numel() else 0
        # left-align each row's trained tokens: (B, width)
        slot = (valid.cumsum(-1) - 1).clamp_min(0)
        packed_g = returns.new_zeros(returns.shape[0], width)
        packed_w = torch.zeros_like(packed_g)
        rows, cols = valid.nonzero(as_tuple=True)
        packed_g[rows, slot[rows, cols]] = returns[rows, cols]
        packed_w[rows, slot[rows, cols]] = w_cum[rows, cols].to(packed_w.dtype)
        packed_mask = (torch.arange(width, device=returns.device)[None, :] < lengths[:, None]).to(torch.float32)
        # empty rows: groups of their own
        gid = torch.where(lengths > 0, gid, -1 - torch.arange(len(gid), device=returns.device))
        baselines = _otb_baseline(packed_g, packed_w, packed_mask, gid, handle_zero_tail, otb_epsilon)
        adv = torch.zeros_like(returns)
        adv[rows, cols] = (packed_g - baselines)[rows, slot[rows, cols]]
    return adv, returns


@register_adv_est(AdvantageEstimator.TIR_OPTIMAL_TOKEN_BASELINE, EstimatorNeeds(groups=True, sum_pi_squared=True))
def compute_tir_optimal_token_baseline_advantage(token_level_rewards: torch.Tensor, response_mask: torch.Tensor,
                                                 index: np.ndarray, **kwargs: Any
                                                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """OTB for multi-turn rows (tool-integrated reasoning): the same baseline, but position t is the row's t-th
    *trained* token (`response_mask` 1), so tool and user tokens between the turns do not misalign the rows
    of a group. Rows with no trained token get 0. Keywords as `compute_optimal_token_baseline_advantage`."""
    kwargs.pop("by_trained_token", None)
    return compute_optimal_token_baseline_advantage(token_level_rewards, response_mask, index,
                                                    by_trained_token=True, **kwargs)
