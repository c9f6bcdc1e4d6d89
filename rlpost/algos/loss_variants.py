"""More policy losses, registered under verl's names: clip_cov, kl_cov, geo_mean, cispo, sapo, topr.

Shapes: B = batch rows, R = response length. Same calling convention and return tuple as the losses
in `losses.py`; every loss here needs the actor config. Keys read:
    clip_cov: clip_ratio, clip_ratio_low/high, policy_loss.{clip_cov_ratio, clip_cov_lb, clip_cov_ub}
    kl_cov:   policy_loss.{kl_cov_ratio, ppo_kl_coef}
    geo_mean, cispo: clip_ratio, clip_ratio_low/high
    sapo:     tau_pos, tau_neg
    topr:     policy_loss.{topr_negative_ratio_lower, topr_negative_ratio_upper}
"""

from __future__ import annotations

from typing import Any

import torch

from rlpost.algos.losses import (_clip_params, batch_info, cfg_value, policy_loss_tuple,
                                 register_policy_loss, row_mean)
from rlpost.utils.masked import masked_mean

LossTuple = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def _clip_range(config: Any) -> tuple[float, float]:
    """(low, high) from the actor config; either falls back to clip_ratio when None."""
    if config is None:
        raise ValueError("this policy loss needs the actor config (clip_ratio, clip_ratio_low, clip_ratio_high)")
    p = _clip_params(config, clip_ratio=None, clip_ratio_low=None, clip_ratio_high=None)
    return p["clip_ratio_low"], p["clip_ratio_high"]


def _centred_cov(advantages: torch.Tensor, log_prob: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """(B, R) per-token (A - mean A) * (log pi - mean log pi), means over valid tokens, no gradient."""
    adv, logp = advantages.detach(), log_prob.detach()
    return (adv - masked_mean(adv, valid)) * (logp - masked_mean(logp, valid))


@register_policy_loss("clip_cov")
def compute_policy_loss_clip_cov(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> LossTuple:
    """Clip-Cov (Cui et al. 2025, entropy mechanism): PPO clip, plus a few high-covariance tokens detached.

    cov_t = (A_t - mean A) * (log pi_t - mean log pi) over valid tokens. Among the valid tokens the PPO
    clip leaves alone and with clip_cov_lb < cov_t < clip_cov_ub, max(1, int(clip_cov_ratio * valid
    tokens)) are drawn at random (torch's global RNG) and get zero loss, so their gradient is cut.
    Other tokens: max(-A * r, -A * clip(r, 1 - low, 1 + high)), r = exp(log_prob - old_log_prob).

    Returns:
        pg_loss, pg_clipfrac (share of valid tokens cut by the covariance rule), ppo_kl, 0.
    """
    low, high = _clip_range(config)
    pl = cfg_value(config, "policy_loss")
    ratio_frac, lb, ub = (float(cfg_value(pl, k)) for k in ("clip_cov_ratio", "clip_cov_lb", "clip_cov_ub"))
    if ratio_frac <= 0:
        raise ValueError(f"actor.policy_loss.clip_cov_ratio={ratio_frac} is invalid: it must be > 0 (verl: 0.0002)")
    log_ratio = log_prob - old_log_prob
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - low, 1.0 + high)
    valid = response_mask > 0
    cov = _centred_cov(advantages, log_prob, response_mask)
    candidates = valid & ~(clipped > unclipped) & (cov > lb) & (cov < ub)
    idx = torch.nonzero(candidates.reshape(-1)).squeeze(-1)
    n_cut = max(int(ratio_frac * int(valid.sum())), 1)
    idx = idx[torch.randperm(idx.numel(), device=idx.device)[:n_cut]]
    keep = torch.ones(advantages.numel(), dtype=advantages.dtype, device=advantages.device)
    keep[idx] = 0.0
    keep = keep.reshape(advantages.shape)
    return policy_loss_tuple(torch.maximum(unclipped, clipped) * keep, log_ratio, response_mask, loss_agg_mode,
                             rollout_is_weights, clipped=keep == 0, **batch_info(config))


@register_policy_loss("kl_cov")
def compute_policy_loss_kl_cov(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> LossTuple:
    """KL-Cov (Cui et al. 2025): unclipped -A * r, plus a |log r| penalty on the highest-covariance tokens.

    The max(1, int(kl_cov_ratio * valid tokens)) valid tokens with the largest
    cov_t = (A_t - mean A) * (log pi_t - mean log pi) get -A * r + ppo_kl_coef * |log_prob - old_log_prob|;
    all others -A * r, r = exp(log_prob - old_log_prob).

    Returns:
        pg_loss, 0, ppo_kl = mean |log_prob - old_log_prob| over valid tokens (verl's metric), 0.
    """
    if config is None:
        raise ValueError("policy loss 'kl_cov' needs the actor config (policy_loss.kl_cov_ratio, ppo_kl_coef)")
    pl = cfg_value(config, "policy_loss")
    ratio_frac, coef = float(cfg_value(pl, "kl_cov_ratio")), float(cfg_value(pl, "ppo_kl_coef"))
    if ratio_frac <= 0:
        raise ValueError(f"actor.policy_loss.kl_cov_ratio={ratio_frac} is invalid: it must be > 0 (verl: 0.0002)")
    log_ratio = log_prob - old_log_prob
    abs_kl = log_ratio.abs()
    pg_losses = -advantages * torch.exp(log_ratio)
    valid = (response_mask > 0).reshape(-1)
    n_valid = int(valid.sum())
    if n_valid > 0:
        cov = _centred_cov(advantages, log_prob, response_mask).reshape(-1)
        cov = cov.masked_fill(~valid, float("-inf"))
        top = torch.topk(cov, max(1, int(n_valid * ratio_frac))).indices
        penalised = torch.zeros_like(valid)
        penalised[top] = True
        pg_losses = torch.where(penalised.reshape(pg_losses.shape), pg_losses + coef * abs_kl, pg_losses)
    return policy_loss_tuple(pg_losses, log_ratio, response_mask, loss_agg_mode, rollout_is_weights,
                             kl_values=abs_kl, **batch_info(config))


@register_policy_loss("geo_mean")
def compute_policy_loss_geo_mean(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> LossTuple:
    """GMPO (Zhao et al. 2025): maximise the geometric mean of token ratios, clipped per token in log space.

    d_t = log_prob - old_log_prob; with s = sign(A_t), d'_t = s * min(s * d_t, s * clip(d_t, -low, high)).
    Per row: rho = exp(mean_t d'_t), a = mean_t A_t (sequence advantage), loss_i = -a * rho; IS weights
    enter as their per-row geometric mean. The loss is one value per sequence, so it is averaged over
    rows with a valid token whatever `loss_agg_mode` says (as verl).

    Returns:
        pg_loss, pg_clipfrac (valid tokens clipped with A > 0), ppo_kl, pg_clipfrac_lower (clipped, A < 0).
    """
    low, high = _clip_range(config)
    mask = response_mask.to(log_prob.dtype)
    lengths = mask.sum(dim=-1)
    log_ratio = log_prob - old_log_prob
    sign = torch.sign(advantages)
    clamped = log_ratio.clamp(-low, high)
    clipped_log_ratio = sign * torch.minimum(sign * log_ratio, sign * clamped)
    rho = torch.exp((clipped_log_ratio * mask).sum(dim=-1) / (lengths + 1e-8))
    seq_adv = (advantages * mask).sum(dim=-1) / (lengths + 1e-8)
    pg_losses = -seq_adv * rho
    if rollout_is_weights is not None:
        log_w = torch.log(rollout_is_weights.detach() + 1e-10)
        pg_losses = pg_losses * torch.exp((log_w * mask).sum(dim=-1) / (lengths + 1e-8))
    pg_loss = masked_mean(pg_losses, (lengths > 0).to(pg_losses.dtype))
    was_clipped = log_ratio != clamped
    pg_clipfrac = masked_mean((was_clipped & (advantages > 0)).to(mask.dtype), response_mask)
    pg_clipfrac_lower = masked_mean((was_clipped & (advantages < 0)).to(mask.dtype), response_mask)
    return pg_loss, pg_clipfrac, masked_mean(-log_ratio, response_mask).detach(), pg_clipfrac_lower


@register_policy_loss("cispo")
def compute_policy_loss_cispo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> LossTuple:
    """CISPO (MiniMax-M1, 2025): clip the importance weight, not the update; every token keeps a gradient.

    L_t = -sg[clip(r_t, 1 - low, 1 + high)] * A_t * log_prob_t, r_t = exp(log_prob - old_log_prob)
    (log-ratio clamped to [-20, 20]). The loss value is not a surrogate of the return; its gradient
    is the clipped-weight REINFORCE gradient.

    Returns:
        pg_loss, pg_clipfrac (valid tokens whose weight was clipped), ppo_kl, 0.
    """
    low, high = _clip_range(config)
    log_ratio = (log_prob - old_log_prob).clamp(-20.0, 20.0)
    ratio = torch.exp(log_ratio)
    weight = ratio.clamp(1.0 - low, 1.0 + high).detach()
    return policy_loss_tuple(-weight * advantages * log_prob, log_ratio, response_mask, loss_agg_mode,
                             rollout_is_weights, clipped=ratio != weight, **batch_info(config))


@register_policy_loss("sapo")
def compute_policy_loss_sapo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "seq-mean-token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> LossTuple:
    """SAPO (Qwen, 2025): a smooth sigmoid gate on the ratio instead of a hard clip.

    f(r, tau) = sigmoid(tau * (r - 1)) * 4 / tau, with tau = tau_pos where A_t > 0 else tau_neg;
    L_t = -f(r_t, tau) * A_t, r_t = exp(log_prob - old_log_prob) (log-ratio clamped to [-20, 20]).
    At r = 1 the gate's slope is 1, so the gradient equals vanilla PPO's there. verl always aggregates
    SAPO with seq-mean-token-mean; here `loss_agg_mode` is honoured (set it to that to match).

    Returns:
        pg_loss, 0, ppo_kl, 0.
    """
    if config is None:
        raise ValueError("policy loss 'sapo' needs the actor config (tau_pos, tau_neg)")
    tau_pos, tau_neg = float(cfg_value(config, "tau_pos")), float(cfg_value(config, "tau_neg"))
    if tau_pos <= 0 or tau_neg <= 0:
        raise ValueError(f"actor.tau_pos={tau_pos}, actor.tau_neg={tau_neg} are invalid: both must be > 0 "
                         "(verl: 1.0, 1.05)")
    log_ratio = (log_prob - old_log_prob).clamp(-20.0, 20.0)
    ratio = torch.exp(log_ratio)
    tau = torch.where(advantages > 0, tau_pos, tau_neg).to(ratio.dtype)
    gate = torch.sigmoid(tau * (ratio - 1.0)) * 4.0 / tau
    return policy_loss_tuple(-gate * advantages, log_ratio, response_mask, loss_agg_mode, rollout_is_weights,
                             **batch_info(config))


@register_policy_loss("topr")
def compute_policy_loss_topr(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> LossTuple:
    """TOPR (Tapered Off-Policy REINFORCE, Le Roux et al. 2025): REINFORCE with an asymmetric importance weight.

    L_t = -sg[w_t] * A_t * log_prob_t, where w_t = 1 where A_t >= 0 and, where A_t < 0,
    w_t = clip(s_i, lower, upper) with s_i = exp(mean_t(log_prob - old_log_prob)) over row i's valid tokens
    (the length-normalised sequence ratio) and [lower, upper] = policy_loss.topr_negative_ratio_{lower,upper}
    (verl's [0, 1]). On-policy (s_i = 1) it is plain REINFORCE.

    Returns:
        pg_loss, pg_clipfrac (negative-advantage tokens whose ratio was tapered), ppo_kl, 0.
    """
    if config is None:
        raise ValueError("policy loss 'topr' needs the actor config (policy_loss.topr_negative_ratio_lower/upper)")
    pl = cfg_value(config, "policy_loss")
    lower, upper = (float(cfg_value(pl, f"topr_negative_ratio_{k}")) for k in ("lower", "upper"))
    if not 0.0 <= lower <= upper:
        raise ValueError(f"actor.policy_loss.topr_negative_ratio_lower={lower}, topr_negative_ratio_upper={upper}: "
                         "need 0 <= lower <= upper (verl: 0.0, 1.0)")
    mask = response_mask.to(log_prob.dtype)
    log_ratio = log_prob - old_log_prob
    seq_log_ratio = row_mean(log_ratio, mask)
    seq_ratio = torch.exp(seq_log_ratio.clamp(-20.0, 20.0)).detach().unsqueeze(-1).expand_as(log_prob)
    negative = advantages < 0
    weight = torch.where(negative, seq_ratio.clamp(lower, upper), torch.ones_like(seq_ratio))
    tapered = negative & ((seq_ratio < lower) | (seq_ratio > upper))
    return policy_loss_tuple(-weight * advantages * log_prob, log_ratio, response_mask, loss_agg_mode,
                             rollout_is_weights, clipped=tapered, **batch_info(config))


@register_policy_loss("dro")
def compute_policy_loss_dro(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> LossTuple:
    """DRO-style regularised policy gradient: no clip, a quadratic penalty on the log-ratio instead.

    L_t = -(A_t * log_prob_t - beta / 2 * (log_prob_t - old_log_prob_t)^2), beta = policy_loss.dro_beta.
    Its gradient is that of vanilla policy gradient at the old policy, pulled back in proportion to how far
    the log-probability has moved, so large off-policy steps are damped without a hard cut-off.

    Returns:
        pg_loss, 0, ppo_kl (mean old - new log-prob), 0.
    """
    if config is None:
        raise ValueError("policy loss 'dro' needs the actor config (policy_loss.dro_beta)")
    beta = cfg_value(cfg_value(config, "policy_loss"), "dro_beta")
    if beta is None or float(beta) < 0:
        raise ValueError(f"actor.policy_loss.dro_beta={beta} is invalid for loss_mode=dro: set a value >= 0, "
                         "e.g. actor_rollout_ref.actor.policy_loss.dro_beta=0.05")
    log_ratio = log_prob - old_log_prob
    pg_losses = -(advantages * log_prob - 0.5 * float(beta) * log_ratio.pow(2))
    return policy_loss_tuple(pg_losses, log_ratio, response_mask, loss_agg_mode, rollout_is_weights,
                             **batch_info(config))
