"""Loss aggregation, policy losses (selected by name) and the clipped value loss.

Shapes: B = batch rows, R = response length.

Policy-loss calling convention: every registered loss is called as
    fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None,
       rollout_is_weights=None)
where `config` is the actor config (`actor_rollout_ref.actor`: clip_ratio, clip_ratio_low/high,
clip_ratio_c, tau_pos/tau_neg and the `policy_loss` group, read through `cfg_value`) and
`rollout_is_weights` (B, R) are detached off-policy correction weights (see `rollout_correction.py`)
that multiply the per-token loss before aggregation. Each returns verl's tuple
    (pg_loss: scalar, pg_clipfrac: scalar, ppo_kl: scalar, pg_clipfrac_lower: scalar).
Without a config, vanilla / gspo take their clip values as keywords instead (not both); the other
losses need the config. Loss aggregation modes are registered in `LOSS_AGG_MODES`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Callable

import torch

from rlpost.utils.masked import masked_mean
from rlpost.utils.registry import Registry

PolicyLossFn = Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]
POLICY_LOSSES = Registry("policy loss")
LOSS_AGG_MODES = Registry("loss_agg_mode")


def register_policy_loss(name: str) -> Callable[[PolicyLossFn], PolicyLossFn]:
    """Decorator registering a policy loss under `name` (see the module calling convention)."""
    return POLICY_LOSSES.register(name)


def get_policy_loss_fn(name: str) -> PolicyLossFn:
    """The policy loss registered under `name`; a ValueError lists valid names otherwise."""
    return POLICY_LOSSES.get(name)


def cfg_value(config: Any, key: str) -> Any:
    """`config.key` for a DictConfig, dataclass or namespace; `config[key]` for a plain dict.

    Raises:
        ValueError: the key is missing (every key a loss reads must be in the config).
    """
    try:
        return config[key] if isinstance(config, Mapping) else getattr(config, key)
    except (KeyError, AttributeError) as err:
        raise ValueError(f"the config has no key {key!r}; every key an algorithm reads must be set") from err


def batch_info(config: Any) -> dict[str, Any]:
    """`config.global_batch_info` (verl's extra `agg_loss` arguments; rlpost's actor config holds
    `loss_scale_factor` there when it is set), or {} for a config without it (a plain dict, None)."""
    if config is None:
        return {}
    mapping = isinstance(config, Mapping)
    info = config.get("global_batch_info") if mapping else getattr(config, "global_batch_info", None)
    return dict(info or {})


def row_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B,) mean of each row's valid entries of `values` (B, R); 0 for a row without any."""
    mask = mask.to(values.dtype)
    return (values * mask).sum(dim=-1) / mask.sum(dim=-1).clamp_min(1)


def _per_row(loss_mat: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(row token sums (B,), row valid-token counts (B,)); masked garbage (even nan) is dropped."""
    m = mask.to(loss_mat.dtype)
    sums = torch.where(m.bool(), loss_mat * m, torch.zeros_like(loss_mat)).sum(dim=-1)
    return sums, m.sum(dim=-1)


@LOSS_AGG_MODES.register("token-mean")
def _token_mean(loss_mat: torch.Tensor, mask: torch.Tensor, norm_length: int | None) -> torch.Tensor:
    return masked_mean(loss_mat, mask)


@LOSS_AGG_MODES.register("seq-mean-token-sum")
def _seq_mean_token_sum(loss_mat: torch.Tensor, mask: torch.Tensor, norm_length: int | None) -> torch.Tensor:
    sums, counts = _per_row(loss_mat, mask)
    return masked_mean(sums, (counts > 0).to(sums.dtype))


@LOSS_AGG_MODES.register("seq-mean-token-mean")
def _seq_mean_token_mean(loss_mat: torch.Tensor, mask: torch.Tensor, norm_length: int | None) -> torch.Tensor:
    sums, counts = _per_row(loss_mat, mask)
    return masked_mean(sums / counts.clamp_min(1), (counts > 0).to(sums.dtype))


@LOSS_AGG_MODES.register("seq-mean-token-sum-norm")
def _seq_mean_token_sum_norm(loss_mat: torch.Tensor, mask: torch.Tensor, norm_length: int | None) -> torch.Tensor:
    sums, counts = _per_row(loss_mat, mask)
    divisor = float(norm_length if norm_length is not None else mask.shape[-1])
    return masked_mean(sums / divisor, (counts > 0).to(sums.dtype))


@LOSS_AGG_MODES.register("token-sum")
def _token_sum(loss_mat: torch.Tensor, mask: torch.Tensor, norm_length: int | None) -> torch.Tensor:
    sums, _ = _per_row(loss_mat, mask)
    return sums.sum()


def _global_parts(
    loss_mat: torch.Tensor, mask: torch.Tensor, mode: str, divisor: float | None
) -> tuple[torch.Tensor, torch.Tensor | None, str]:
    """(this micro-batch's numerator, its own denominator, which global count replaces that denominator)."""
    sums, counts = _per_row(loss_mat, mask)
    rows = (counts > 0).to(sums.dtype)
    if mode == "token-mean":
        return sums.sum(), counts.sum(), "tokens"
    if mode == "token-sum":
        return sums.sum(), None, ""
    if mode == "seq-mean-token-sum":
        return (sums * rows).sum(), rows.sum(), "rows"
    if mode == "seq-mean-token-mean":
        return (sums / counts.clamp_min(1) * rows).sum(), rows.sum(), "rows"
    if mode == "seq-mean-token-sum-norm":
        width = float(divisor if divisor is not None else mask.shape[-1])
        return (sums / width * rows).sum(), rows.sum(), "rows"
    raise ValueError(
        f"agg_loss: not supported yet: dp_size / batch_num_tokens / global_batch_size with the user-registered "
        f"loss_agg_mode {mode!r}; built-in modes: {LOSS_AGG_MODES.names()}"
    )


def agg_loss(
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    loss_agg_mode: str,
    dp_size: int = 1,
    batch_num_tokens: int | torch.Tensor | None = None,
    global_batch_size: int | torch.Tensor | None = None,
    loss_scale_factor: int | float | None = None,
    norm_length: int | None = None,
) -> torch.Tensor:
    """Reduces a per-token loss to a scalar with the mode registered under `loss_agg_mode`.

    Modes (rows = sequences with at least one valid token):
        token-mean: sum of valid token losses / number of valid tokens.
        token-sum: sum of valid token losses.
        seq-mean-token-sum: mean over rows of each row's token sum.
        seq-mean-token-mean: mean over rows of each row's token mean.
        seq-mean-token-sum-norm (Dr.GRPO): mean over rows of (row token sum / norm_length), with
            norm_length = the mask width R (the max response length) unless given. A constant
            divisor removes the length bias of per-row token means.

    Global normalisation (verl's arguments): data-parallel ranks average their gradients, so a micro-batch's
    share of the global mean is its numerator / the global count * dp_size. `batch_num_tokens` (valid tokens of
    the whole global batch) replaces the local token count of token-mean, `global_batch_size` (rows of the
    global batch) the local row count of the seq-mean modes; either left None uses this micro-batch's own count.
    token-sum is multiplied by dp_size, so the averaged gradient is that of the global sum.

    Args:
        loss_mat: (B, R) per-token loss.
        loss_mask: (B, R) 1 on tokens that count.
        loss_agg_mode: one of `LOSS_AGG_MODES.names()`.
        dp_size: data-parallel world size the gradients are averaged over.
        batch_num_tokens: valid tokens in the global batch (token-mean).
        global_batch_size: rows in the global batch (seq-mean modes).
        loss_scale_factor: divisor of seq-mean-token-sum-norm (verl's name of `norm_length`).
        norm_length: divisor of seq-mean-token-sum-norm (default R); unused by the other modes.

    Returns:
        Scalar tensor.
    """
    if loss_scale_factor is not None and norm_length is not None and loss_scale_factor != norm_length:
        raise ValueError(f"agg_loss: loss_scale_factor={loss_scale_factor} and norm_length={norm_length} differ; "
                         "they are one divisor, give one of them")
    divisor = loss_scale_factor if loss_scale_factor is not None else norm_length
    if dp_size == 1 and batch_num_tokens is None and global_batch_size is None:
        return LOSS_AGG_MODES.get(loss_agg_mode)(loss_mat, loss_mask, divisor)
    if dp_size < 1:
        raise ValueError(f"agg_loss: dp_size must be >= 1, got {dp_size}")
    LOSS_AGG_MODES.get(loss_agg_mode)  # an unknown name fails with the registry's list of valid names
    numerator, local_count, count_kind = _global_parts(loss_mat, loss_mask, loss_agg_mode, divisor)
    if local_count is None:
        return numerator * dp_size
    given = batch_num_tokens if count_kind == "tokens" else global_batch_size
    count = local_count if given is None else torch.as_tensor(given, dtype=numerator.dtype)
    # an all-masked micro-batch contributes 0 (not 0 / 0)
    return numerator / torch.clamp(count, min=1) * dp_size


def apply_is_weights(pg_losses: torch.Tensor, rollout_is_weights: torch.Tensor | None) -> torch.Tensor:
    """(B, R) per-token loss times the (detached) rollout-correction weights, when given."""
    return pg_losses if rollout_is_weights is None else pg_losses * rollout_is_weights.detach()


def policy_loss_tuple(pg_losses: torch.Tensor, log_ratio: torch.Tensor, response_mask: torch.Tensor,
                      loss_agg_mode: str, rollout_is_weights: torch.Tensor | None = None,
                      clipped: torch.Tensor | None = None, kl_values: torch.Tensor | None = None,
                      loss_scale_factor: float | None = None,
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """verl's loss tuple from per-token losses; the tail every unclipped or single-clip loss shares.

    Args:
        pg_losses: (B, R) per-token loss, before the rollout-correction weights. log_ratio: (B, R)
            log_prob - old_log_prob. response_mask: (B, R). loss_agg_mode: see `agg_loss`.
        rollout_is_weights: (B, R) or None. clipped: (B, R) bool, the tokens the loss counts as clipped, or
            None (the loss does not clip). kl_values: (B, R) what ppo_kl averages instead of -log_ratio.
        loss_scale_factor: the divisor of seq-mean-token-sum-norm (`batch_info(config)` gives it).

    Returns:
        pg_loss, pg_clipfrac (share of valid tokens in `clipped`, else 0), ppo_kl (detached), 0.
    """
    pg_loss = agg_loss(apply_is_weights(pg_losses, rollout_is_weights), response_mask, loss_agg_mode,
                       loss_scale_factor=loss_scale_factor)
    if clipped is None:
        pg_clipfrac = torch.zeros_like(pg_loss).detach()
    else:
        pg_clipfrac = masked_mean(clipped.to(pg_loss.dtype), response_mask)
    ppo_kl = masked_mean(-log_ratio if kl_values is None else kl_values, response_mask).detach()
    return pg_loss, pg_clipfrac, ppo_kl, torch.zeros_like(pg_clipfrac)


def _clip_params(config: Any, **given: float | None) -> dict[str, float]:
    """Clip settings from the actor config, or from keywords; low/high default to clip_ratio."""
    explicit = {k: v for k, v in given.items() if v is not None}
    if config is not None:
        if explicit:
            raise ValueError(f"pass clip settings either in `config` or as keywords, not both: {sorted(explicit)}")
        explicit = {k: cfg_value(config, k) for k in given}
        explicit = {k: v for k, v in explicit.items() if v is not None}
    clip_ratio = float(explicit.get("clip_ratio", 0.2))
    params = {
        "clip_ratio_low": float(explicit.get("clip_ratio_low", clip_ratio)),
        "clip_ratio_high": float(explicit.get("clip_ratio_high", clip_ratio)),
        "clip_ratio_c": float(explicit.get("clip_ratio_c", 3.0)),
    }
    if params["clip_ratio_c"] <= 1.0:
        raise ValueError(f"actor.clip_ratio_c={params['clip_ratio_c']} is invalid: the dual-clip bound must be > 1.0")
    return params


@register_policy_loss("vanilla")
def compute_policy_loss_vanilla(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
    *,
    clip_ratio: float | None = None,
    clip_ratio_low: float | None = None,
    clip_ratio_high: float | None = None,
    clip_ratio_c: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """PPO clipped surrogate (Schulman et al. 2017) with asymmetric clip and dual clip (Ye et al. 2020).

    ratio = exp(log_prob - old_log_prob) (log-ratio clamped to [-20, 20]);
    L = max(-A * ratio, -A * clip(ratio, 1 - low, 1 + high)); for A < 0 also L = min(L, -A * c).

    Args:
        old_log_prob: (B, R). log_prob: (B, R) with grad. advantages: (B, R). response_mask: (B, R).
        loss_agg_mode: see `agg_loss`. config: actor config (clip_ratio, clip_ratio_low/high, clip_ratio_c).
        rollout_is_weights: (B, R) off-policy correction weights multiplying the token losses, or None.
        clip_ratio, clip_ratio_low, clip_ratio_high, clip_ratio_c: keywords used when config is None
            (defaults 0.2, = clip_ratio, = clip_ratio, 3.0).

    Returns:
        pg_loss, pg_clipfrac (share of tokens where the clip is active), ppo_kl (mean old - new
        log-prob), pg_clipfrac_lower (share of tokens hit by the dual clip); all scalars.
    """
    p = _clip_params(
        config, clip_ratio=clip_ratio, clip_ratio_low=clip_ratio_low, clip_ratio_high=clip_ratio_high,
        clip_ratio_c=clip_ratio_c,
    )
    log_ratio = (log_prob - old_log_prob).clamp(-20.0, 20.0)
    ratio = torch.exp(log_ratio)
    ppo_kl = masked_mean(-log_ratio, response_mask)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - p["clip_ratio_low"], 1.0 + p["clip_ratio_high"])
    clip_loss = torch.maximum(unclipped, clipped)
    pg_clipfrac = masked_mean((clipped > unclipped).float(), response_mask)
    dual = -advantages * p["clip_ratio_c"]
    dual_loss = torch.minimum(clip_loss, dual)
    pg_clipfrac_lower = masked_mean(((clip_loss > dual) & (advantages < 0)).float(), response_mask)
    pg_losses = apply_is_weights(torch.where(advantages < 0, dual_loss, clip_loss), rollout_is_weights)
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode, **batch_info(config))
    return pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower


compute_policy_loss = compute_policy_loss_vanilla  # verl's older name for the same loss


@register_policy_loss("gspo")
def compute_policy_loss_gspo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "seq-mean-token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
    *,
    clip_ratio_low: float | None = None,
    clip_ratio_high: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """GSPO (Zheng et al. 2025): clip a sequence-level importance ratio.

    s_i = exp(mean_t(log_prob - old_log_prob)) over the row's valid tokens (geometric mean of token
    ratios). Per token s_it = sg[s_i] * pi_t / sg[pi_t]: forward value s_i, gradient that of the
    row's token log-probs. L = max(-A * s_it, -A * clip(s_it, 1 - low, 1 + high)).
    Without a config, low/high default to the paper's 3e-4 / 4e-4; with a config they come from
    clip_ratio_low/high (falling back to clip_ratio). The paper aggregates with seq-mean-token-mean.

    Returns:
        pg_loss, pg_clipfrac, ppo_kl (token-level, as vanilla), pg_clipfrac_lower (always 0).
    """
    if config is None and clip_ratio_low is None and clip_ratio_high is None:
        clip_ratio_low, clip_ratio_high = 3e-4, 4e-4
    p = _clip_params(config, clip_ratio=None, clip_ratio_low=clip_ratio_low, clip_ratio_high=clip_ratio_high)
    mask = response_mask.to(log_prob.dtype)
    log_ratio = log_prob - old_log_prob
    seq_log_ratio = row_mean(log_ratio, mask)
    token_log_ratio = log_prob - log_prob.detach() + seq_log_ratio.detach().unsqueeze(-1)
    ratio = torch.exp(token_log_ratio.clamp(max=10.0))
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - p["clip_ratio_low"], 1.0 + p["clip_ratio_high"])
    pg_losses = apply_is_weights(torch.maximum(unclipped, clipped), rollout_is_weights)
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode, **batch_info(config))
    pg_clipfrac = masked_mean((clipped > unclipped).float(), response_mask)
    ppo_kl = masked_mean(-log_ratio, response_mask).detach()
    return pg_loss, pg_clipfrac, ppo_kl, torch.zeros_like(pg_loss)


@register_policy_loss("gpg")
def compute_policy_loss_gpg(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """GPG (Chu et al. 2025) policy gradient without ratio or clip: L = -A * log_prob.

    Clip settings in `config` do not apply. Returns pg_loss, 0, ppo_kl, 0 (verl's tuple order).
    """
    return policy_loss_tuple(-advantages * log_prob, log_prob - old_log_prob, response_mask, loss_agg_mode,
                             rollout_is_weights, **batch_info(config))


def compute_value_loss(
    vpreds: torch.Tensor,
    returns: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange_value: float,
    loss_agg_mode: str = "token-mean",
    dp_size: int = 1,
    batch_num_tokens: int | torch.Tensor | None = None,
    global_batch_size: int | torch.Tensor | None = None,
    loss_scale_factor: int | float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Clipped value loss: 0.5 * agg(max((v - G)^2, (clip(v, V_old - c, V_old + c) - G)^2)).

    Args:
        vpreds: (B, R) new critic values (with grad). returns: (B, R) targets.
        values: (B, R) critic values at rollout time. response_mask: (B, R).
        cliprange_value: c. loss_agg_mode, dp_size, batch_num_tokens, global_batch_size, loss_scale_factor:
            passed to `agg_loss` (global normalisation across data-parallel ranks).

    Returns:
        vf_loss scalar, vf_clipfrac scalar (share of tokens where the clipped term is larger).
    """
    vpred_clipped = torch.maximum(torch.minimum(vpreds, values + cliprange_value), values - cliprange_value)
    losses_unclipped = (vpreds - returns) ** 2
    losses_clipped = (vpred_clipped - returns) ** 2
    vf_loss = 0.5 * agg_loss(
        torch.maximum(losses_unclipped, losses_clipped), response_mask, loss_agg_mode, dp_size=dp_size,
        batch_num_tokens=batch_num_tokens, global_batch_size=global_batch_size, loss_scale_factor=loss_scale_factor,
    )
    vf_clipfrac = masked_mean((losses_clipped > losses_unclipped).float(), response_mask)
    return vf_loss, vf_clipfrac
