"""Off-policy rollout correction: truncated importance weights and rejection of outlier tokens / sequences.

The rollout engine samples with pi_rollout (e.g. vLLM in bf16), the actor trains against pi_old (its
own recomputed log-probs); the gap biases the gradient. With ratio rho = pi_old / pi_rollout:
    IS  (`rollout_is`):  multiply each token loss by min(rho, threshold) (token) or by the clipped
        product of the row's token ratios (sequence), optionally rescaled to mean 1.
    RS  (`rollout_rs`):  drop tokens (token) or whole rows (sequence, geometric) whose ratio falls
        outside [1 / threshold, threshold] from `response_mask`; or verl's criteria (token_k1 ...
        seq_max_k3), comma-separated. `rollout_rs_threshold_lower` moves the lower bound of the single
        levels off 1 / threshold; `rollout_token_veto_threshold` drops every row holding a token whose
        ratio is below it (with or without IS / RS).
Shapes: B = batch rows, R = response length. Option names and meanings follow verl's
`algorithm.rollout_correction` (rollout_corr_helper).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from rlpost.algos.losses import (
    agg_loss,
    apply_is_weights,
    batch_info,
    cfg_value,
    compute_policy_loss_vanilla,
    register_policy_loss,
    row_mean,
)
from rlpost.utils.masked import masked_mean

IS_LEVELS = ("token", "sequence")
RS_LEVELS = ("token", "sequence", "geometric")
# verl's rejection criteria: <level>_<estimator>, the level token or a row's sum / mean / max of the token values
RS_CRITERIA = ("token_k1", "token_k2", "token_k3", "seq_sum_k1", "seq_sum_k2", "seq_sum_k3", "seq_mean_k1",
               "seq_mean_k2", "seq_mean_k3", "seq_max_k2", "seq_max_k3")
LOSS_TYPES = ("ppo_clip", "reinforce")
_SAFETY_BOUND = 20.0  # |log-ratio| cap before exp(): exp(20) ~ 4.9e8 stays finite in float32


@dataclass(frozen=True)
class Criterion:
    """One rejection criterion: keep a token (or row) whose statistic lies in [lower, upper].

    k1 compares the ratio itself (its log against log lower / log upper); k2 is 0.5 * log(rho)^2 and k3
    rho - 1 - log(rho), each against `upper` only (lower = -inf)."""

    name: str
    level: str  # token, sum, mean or max
    k: int
    lower: float
    upper: float


def _band(text: str, what: str) -> tuple[float, float]:
    """(lower, upper) of a 'lower_upper' threshold, or of a single float u > 1 as [1/u, u]."""
    try:
        parts = [float(x) for x in str(text).split("_")]
    except ValueError:
        parts = []
    if len(parts) == 1 and parts[0] > 1:
        return 1.0 / parts[0], parts[0]
    if len(parts) != 2 or not 0 < parts[0] < parts[1]:
        raise ValueError(f"{what}={text!r} is invalid: give a ratio band 'lower_upper' with 0 < lower < upper "
                         "(e.g. '0.5_2.0')")
    return parts[0], parts[1]


def parse_rejection(rollout_rs: str | None, threshold: Any) -> list[Criterion] | None:
    """verl's comma-separated criteria (all must hold) with one threshold each, comma-separated too: a ratio band
    'lower_upper' for *_k1, an upper bound for *_k2 / *_k3. None for off or rlpost's single levels (RS_LEVELS).

    Raises:
        ValueError: an unknown criterion, a threshold count that does not match, a bad threshold.
    """
    if rollout_rs is None or rollout_rs in RS_LEVELS:
        return None
    names = [n.strip() for n in str(rollout_rs).split(",") if n.strip()]
    unknown = [n for n in names if n not in RS_CRITERIA]
    if unknown or not names:
        raise ValueError(f"rollout_correction.rollout_rs={rollout_rs!r}: unknown criteria {unknown}; use null, one of "
                         f"{RS_LEVELS}, or criteria out of {RS_CRITERIA} separated by commas")
    texts = [t.strip() for t in str(threshold).split(",")] if threshold is not None else []
    if len(texts) != len(names):
        raise ValueError(f"rollout_correction.rollout_rs={rollout_rs!r} needs one rollout_rs_threshold per "
                         f"criterion, comma-separated (got {threshold!r}), e.g. '0.5_2.0' for a *_k1 criterion "
                         "and '0.005' for *_k2 / *_k3")
    out = []
    for name, text in zip(names, texts):
        level, k = ("token" if name.startswith("token") else name.split("_")[1]), int(name[-1])
        what = f"rollout_correction.rollout_rs_threshold ({name})"
        if k == 1:
            lower, upper = _band(text, what)
        else:
            try:
                upper = float(text)
            except ValueError:
                upper = -1.0
            if upper <= 0:
                raise ValueError(f"{what}={text!r} is invalid: an upper bound > 0 (e.g. 0.005)")
            lower = -math.inf
        out.append(Criterion(name, level, k, lower, upper))
    return out


def parse_is_threshold(threshold: Any) -> tuple[float | None, float]:
    """(lower or None, upper) of rollout_is_threshold: a float u > 0 truncates weights at u (TIS); 'lower_upper'
    zeroes weights outside [lower, upper] (IcePop)."""
    if isinstance(threshold, (int, float)) and not isinstance(threshold, bool):
        if threshold <= 0:
            raise ValueError(f"rollout_correction.rollout_is_threshold={threshold} is invalid: must be > 0 (e.g. 2.0)")
        return None, float(threshold)
    if "_" not in str(threshold):
        return parse_is_threshold(float(threshold))
    parts = str(threshold).split("_")
    try:
        lower, upper = (float(x) for x in parts)
    except ValueError:
        lower, upper = 0.0, 0.0
    if len(parts) != 2 or not 0 <= lower < upper:
        raise ValueError(f"rollout_correction.rollout_is_threshold={threshold!r} is invalid: a float > 0 (truncation) "
                         "or 'lower_upper' with 0 <= lower < upper (IcePop, e.g. '0.5_5.0')")
    return lower, upper


def _optional(cfg: Any, key: str) -> Any:
    """An optional key of verl's older rollout_correction (None when the config does not have it)."""
    try:
        return cfg_value(cfg, key)
    except ValueError:
        return None


def check_lower_and_veto(cfg: Any, rs_upper: float | None, criteria: list[Criterion] | None
                         ) -> tuple[float | None, float | None]:
    """(rollout_rs_threshold_lower, rollout_token_veto_threshold) validated: the lower bound of a single
    rejection level (token / sequence / geometric) in (0, upper), the veto in (0, 1).

    Raises:
        ValueError: a bound out of range, or a lower bound where there is no single level to bound.
    """
    lower, veto = _optional(cfg, "rollout_rs_threshold_lower"), _optional(cfg, "rollout_token_veto_threshold")
    if lower is not None:
        if criteria is not None:
            raise ValueError(f"rollout_correction.rollout_rs_threshold_lower={lower} does not apply to verl's criteria "
                             f"({', '.join(c.name for c in criteria)}): give each *_k1 criterion its band in "
                             "rollout_rs_threshold (e.g. '0.5_2.0'), and leave rollout_rs_threshold_lower null")
        if rs_upper is None:
            raise ValueError(f"rollout_correction.rollout_rs_threshold_lower={lower} needs rollout_rs (token, sequence "
                             "or geometric); set rollout_rs=token or leave it null")
        if not 0 < float(lower) < rs_upper:
            raise ValueError(f"rollout_correction.rollout_rs_threshold_lower={lower} is invalid: must be in (0, "
                             f"{rs_upper}) (the upper bound); e.g. {1 / rs_upper:.4g}, or null for 1 / upper")
    if veto is not None and not 0 < float(veto) < 1:
        raise ValueError(f"rollout_correction.rollout_token_veto_threshold={veto} is invalid: must be in (0, 1), "
                         "the token ratio below which the whole sequence is rejected (e.g. 1e-4), or null (off)")
    return (None if lower is None else float(lower)), (None if veto is None else float(veto))


def _check(cfg: Any) -> tuple[str | None, tuple[float | None, float], str | None, float, list[Criterion] | None,
                              bool, str]:
    """Reads and validates the config: (is_level, (is_lower, is_upper), rs_level, rs_thr, criteria, bypass,
    loss_type); `criteria` is set for verl's criteria (then rs_level is None)."""
    is_level, is_band = cfg_value(cfg, "rollout_is"), parse_is_threshold(cfg_value(cfg, "rollout_is_threshold"))
    rs_level, loss_type = cfg_value(cfg, "rollout_rs"), cfg_value(cfg, "loss_type")
    bypass, rs_thr = bool(cfg_value(cfg, "bypass_mode")), cfg_value(cfg, "rollout_rs_threshold")
    if is_level not in (None, *IS_LEVELS):
        raise ValueError(f"rollout_correction.rollout_is={is_level!r} is invalid: must be null or one of {IS_LEVELS}")
    criteria = parse_rejection(rs_level, rs_thr)
    if criteria is not None:
        rs_level, rs_thr = None, 0.0
    elif rs_level is not None:
        if rs_thr is None and is_band[0] is not None:
            raise ValueError("rollout_correction.rollout_rs needs rollout_rs_threshold when rollout_is_threshold is "
                             "a band")
        rs_thr = float(rs_thr if rs_thr is not None else is_band[1])
        if rs_thr <= 1:
            raise ValueError(f"rollout_correction.rollout_rs_threshold={rs_thr} is invalid: must be > 1, the "
                             "accepted ratios being [1/threshold, threshold] (e.g. 2.0, or 1.001 for geometric)")
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"rollout_correction.loss_type={loss_type!r} is invalid: must be one of {LOSS_TYPES}")
    if loss_type == "reinforce" and not bypass:
        raise ValueError("rollout_correction.loss_type='reinforce' applies in bypass mode only: "
                         "set bypass_mode=true or loss_type='ppo_clip'")
    return is_level, is_band, rs_level, rs_thr, criteria, bypass, loss_type


def _row_log_ratio(log_ratio: torch.Tensor, mask: torch.Tensor, mean: bool) -> torch.Tensor:
    """(B, 1) sum (or mean) of the token log-ratios over each row's valid tokens."""
    if mean:
        return row_mean(log_ratio, mask).unsqueeze(-1)
    return (log_ratio * mask).sum(dim=-1, keepdim=True)


def _rejection_mask(log_ratio: torch.Tensor, mask: torch.Tensor, level: str, thr: float,
                    lower: float | None = None) -> torch.Tensor:
    """(B, R) 1 where the token's (or its row's) ratio lies in [lower, thr] (lower None: 1/thr), else 0."""
    lr = log_ratio if level == "token" else _row_log_ratio(log_ratio, mask, mean=level == "geometric")
    low = -math.log(thr) if lower is None else math.log(lower)
    inside = (lr >= low) & (lr <= math.log(thr))
    return inside.expand_as(log_ratio).to(mask.dtype)


def _criterion_mask(log_ratio: torch.Tensor, mask: torch.Tensor, c: Criterion) -> torch.Tensor:
    """(B, R) 1 where criterion `c` keeps the token (token level) or its row (sum / mean / max levels)."""
    if c.k == 1:
        value = log_ratio
    elif c.k == 2:
        value = 0.5 * log_ratio ** 2
    else:
        value = torch.expm1(log_ratio.clamp(max=_SAFETY_BOUND)) - log_ratio
    value = value * mask
    if c.level == "sum":
        value = value.sum(-1, keepdim=True)
    elif c.level == "mean":
        value = value.sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp_min(1)
    elif c.level == "max":
        value = value.masked_fill(mask == 0, float("-inf")).max(-1, keepdim=True).values
    lower, upper = (math.log(c.lower), math.log(c.upper)) if c.k == 1 else (c.lower, c.upper)
    return ((value >= lower) & (value <= upper)).expand_as(log_ratio).to(mask.dtype)


def compute_rollout_correction(
    old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, response_mask: torch.Tensor, cfg: Any,
    with_metrics: bool = True,
) -> tuple[torch.Tensor | None, torch.Tensor, dict[str, float]]:
    """Importance weights and rejection mask for training on rollouts sampled by another policy.

    log rho_t = old_log_prob - rollout_log_prob (clamped to +-20 before exp).
    IS weights (cfg.rollout_is): token: w_t = min(rho_t, thr); sequence: w_t = min(exp(sum_t' log rho_t'),
        thr) on every valid token of the row (thr = rollout_is_threshold); a threshold 'lower_upper' (IcePop)
        zeroes the weights outside [lower, upper] instead, their tokens staying in the mask. With
        rollout_is_batch_normalize the truncated weights are divided by their mean over the kept
        valid tokens (token) or kept sequences (sequence), so the weights that reach the loss
        average 1. Weights are detached and 0 where the returned mask is 0.
    Rejection (cfg.rollout_rs, threshold rollout_rs_threshold or else rollout_is_threshold): token:
        drop tokens with rho_t outside [1/thr, thr]; sequence: drop rows whose product of ratios is
        outside; geometric: drop rows whose geometric-mean ratio exp(mean_t log rho_t) is outside. verl's
        criteria (`parse_rejection`, comma-separated, all must hold): *_k1 keep the ratio (token), the row's
        product (seq_sum) or geometric mean (seq_mean) in its band; *_k2 / *_k3 keep 0.5 log(rho)^2 /
        rho - 1 - log(rho) of the token, or the row's sum / mean / max of it, at most the threshold.
        rollout_rs_threshold_lower (single levels only) replaces 1/thr as the lower bound.
    Veto (cfg.rollout_token_veto_threshold v): a row with any valid token rho_t < v is dropped whole, after RS.
    Bypass mode (old_log_prob are then the training policy's current log-probs): with loss_type
        ppo_clip no weights are returned (the PPO ratio pi / pi_rollout already corrects), with
        reinforce the weights are returned for -w * A * log pi.

    Args:
        old_log_prob: (B, R) training-policy log-probs. rollout_log_prob: (B, R) rollout-engine log-probs.
        response_mask: (B, R) 1 on response tokens.
        cfg: attributes rollout_is, rollout_is_threshold, rollout_is_batch_normalize, rollout_rs,
            rollout_rs_threshold, bypass_mode, loss_type (verl's `algorithm.rollout_correction`), and optionally
            rollout_rs_threshold_lower, rollout_token_veto_threshold.
        with_metrics: False skips the metrics (each is a device read; the bypass loss runs per micro-batch).

    Returns:
        weights (B, R) or None (rollout_is null, or bypass ppo_clip), response mask after rejection
        (B, R), metrics under rollout_corr/: log_ratio_mean, k3_kl, rejected_frac (valid tokens
        dropped), rejected_seq_frac (rows losing a token), rollout_rs_<criterion>_masked_fraction per
        criterion; with the veto catastrophic_token_frac (valid tokens below it) and veto_seq_frac (rows it
        drops); with IS also is_weight_mean/max/min (of the truncated weights before normalisation, over
        kept valid tokens), truncated_frac (share of those tokens whose weight hit the threshold, or left
        the band) and is_batch_norm_factor when normalising.
    """
    is_level, (is_lower, is_thr), rs_level, rs_thr, criteria, bypass, loss_type = _check(cfg)
    rs_lower, veto = check_lower_and_veto(cfg, rs_thr if rs_level is not None else None, criteria)
    mask = response_mask.to(old_log_prob.dtype)
    log_ratio = (old_log_prob - rollout_log_prob).detach().to(mask.dtype)
    log_ratio = torch.where(mask.bool(), log_ratio, torch.zeros_like(log_ratio))  # padding may hold garbage
    keep = mask if rs_level is None else mask * _rejection_mask(log_ratio, mask, rs_level, rs_thr, rs_lower)
    veto_metrics = {}
    if veto is not None:  # one catastrophic token (ratio below the veto) rejects its whole row
        low = (log_ratio < math.log(veto)) & mask.bool()
        vetoed = low.any(-1, keepdim=True)
        keep = keep * (~vetoed).to(keep.dtype)
        rows = mask.sum(-1) > 0
        if with_metrics:
            veto_metrics = {"rollout_corr/catastrophic_token_frac": float(masked_mean(low.to(mask.dtype), mask)),
                            "rollout_corr/veto_seq_frac": float(vetoed.squeeze(-1)[rows].float().mean())
                            if rows.any() else 0.0}
    per_criterion = {}
    for c in criteria or ():
        kept = _criterion_mask(log_ratio, mask, c)
        if with_metrics:
            per_criterion[f"rollout_corr/rollout_rs_{c.name}_masked_fraction"] = float(masked_mean(1.0 - kept, mask))
        keep = keep * kept
    valid_rows = mask.sum(-1) > 0
    metrics = {**per_criterion, **veto_metrics,
        "rollout_corr/log_ratio_mean": float(masked_mean(log_ratio, mask)),
        "rollout_corr/k3_kl": float(masked_mean(torch.expm1(log_ratio.clamp(max=_SAFETY_BOUND)) - log_ratio, mask)),
        "rollout_corr/rejected_frac": float(masked_mean(1.0 - keep, mask)),
        "rollout_corr/rejected_seq_frac": float(((keep.sum(-1) < mask.sum(-1)) & valid_rows).float().sum()
                                                / valid_rows.sum().clamp_min(1)),
    } if with_metrics else {}
    if is_level is None:
        return None, keep, metrics
    row_level = is_level == "sequence"
    lr = _row_log_ratio(log_ratio, mask, mean=False) if row_level else log_ratio
    raw = torch.exp(lr.clamp(-_SAFETY_BOUND, _SAFETY_BOUND)).expand_as(log_ratio)
    outside = raw > is_thr if is_lower is None else (raw < is_lower) | (raw > is_thr)
    # truncation (TIS) caps a weight; a band (IcePop) zeroes it, the token staying in the mask
    weights = (raw.clamp(max=is_thr) if is_lower is None else raw * (~outside)) * keep
    metrics.update({} if not with_metrics else {
        "rollout_corr/is_weight_mean": float(masked_mean(weights, keep)),
        "rollout_corr/is_weight_max": float(weights.masked_fill(keep == 0, float("-inf")).max()) if keep.any() else 0.0,
        "rollout_corr/is_weight_min": float(weights.masked_fill(keep == 0, float("inf")).min()) if keep.any() else 0.0,
        "rollout_corr/truncated_frac": float(masked_mean(outside.to(mask.dtype), keep)),
    })
    if cfg_value(cfg, "rollout_is_batch_normalize"):
        kept_rows = keep.sum(-1) > 0
        per_row = weights.sum(-1) / keep.sum(-1).clamp_min(1)  # the row's weight in sequence mode
        mean_w = per_row[kept_rows].mean() if row_level else masked_mean(weights, keep)
        if kept_rows.any() and float(mean_w) > 1e-8:
            weights = weights / mean_w
        if with_metrics:
            metrics["rollout_corr/is_batch_norm_factor"] = float(mean_w) if kept_rows.any() else 1.0
    if bypass and loss_type == "ppo_clip":
        return None, keep, metrics
    return weights.detach(), keep, metrics


def bypass_policy_loss(
    loss_fn: Any,
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str,
    config: Any,
    rollout_correction: Any,
) -> tuple[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]:
    """The policy loss in bypass mode: `old_log_prob` are the rollout engine's log-probs (no actor recompute).

    Weights and rejection come from `compute_rollout_correction(log_prob.detach(), old_log_prob, ...)` with
    `rollout_correction` (algorithm.rollout_correction), i.e. against the current policy, per micro-batch.
    loss_type ppo_clip: `loss_fn` (a registered policy loss; verl's bypass_mode uses vanilla) on the kept
    tokens, its ratio being pi / pi_rollout. reinforce: -w * A * log_prob aggregated over the kept tokens (w = 1
    without IS). Correction metrics are not computed (each would be a device read per micro-batch).

    Returns:
        (pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower (zeros for the clip shares with reinforce)), and the
        (B, R) mask the rejection kept.
    """
    weights, keep, _ = compute_rollout_correction(log_prob.detach(), old_log_prob, response_mask, rollout_correction,
                                                  with_metrics=False)
    if cfg_value(rollout_correction, "loss_type") == "ppo_clip":
        return loss_fn(old_log_prob, log_prob, advantages, keep, loss_agg_mode, config, None), keep
    pg_loss = agg_loss(apply_is_weights(-advantages * log_prob, weights), keep, loss_agg_mode, **batch_info(config))
    zero = torch.zeros_like(pg_loss).detach()
    return (pg_loss, zero, masked_mean(old_log_prob - log_prob, keep).detach(), zero), keep


@register_policy_loss("bypass_mode")
def compute_policy_loss_bypass_mode(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """verl's bypass-mode loss: `bypass_policy_loss` with the vanilla PPO loss and the settings verl keeps in
    `config.policy_loss.rollout_correction`. (rlpost's actor passes algorithm.rollout_correction itself when
    bypass mode is on, so `actor.policy_loss.loss_mode` keeps its meaning there.)

    Returns:
        pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower (zeros for the clip shares with reinforce).
    """
    if rollout_is_weights is not None:
        raise ValueError("bypass_mode computes its own importance weights: the batch must not carry rollout_is_weights")
    rc = cfg_value(cfg_value(config, "policy_loss"), "rollout_correction")
    if not cfg_value(rc, "bypass_mode"):
        raise ValueError("policy_loss.loss_mode='bypass_mode' needs rollout_correction.bypass_mode=true")
    return bypass_policy_loss(compute_policy_loss_vanilla, old_log_prob, log_prob, advantages, response_mask,
                              loss_agg_mode, config, rc)[0]
