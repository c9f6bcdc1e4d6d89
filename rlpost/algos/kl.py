"""KL estimators between the actor and the reference policy, KL controllers, in-reward KL penalty.

Shapes: B = batch rows, R = response length, V = vocabulary.
Estimators are registered in `KL_ESTIMATORS` as fn(logprob, ref_logprob) -> per-token tensor; the
valid config names (`algorithm.kl_penalty`, `actor.kl_loss_type`) are `kl_estimator_names()`.
"""

from __future__ import annotations

import difflib
from typing import Any

import torch

from rlpost.utils.masked import masked_mean
from rlpost.utils.registry import Registry

KL_ESTIMATORS = Registry("kl estimator")


@KL_ESTIMATORS.register("kl")
@KL_ESTIMATORS.register("k1")
def _kl_k1(logprob: torch.Tensor, ref_logprob: torch.Tensor) -> torch.Tensor:
    """k1: d = logprob - ref_logprob (unbiased value, high variance)."""
    return logprob - ref_logprob


@KL_ESTIMATORS.register("abs")
def _kl_abs(logprob: torch.Tensor, ref_logprob: torch.Tensor) -> torch.Tensor:
    """|d|."""
    return (logprob - ref_logprob).abs()


@KL_ESTIMATORS.register("mse")
@KL_ESTIMATORS.register("k2")
def _kl_k2(logprob: torch.Tensor, ref_logprob: torch.Tensor) -> torch.Tensor:
    """k2: 0.5 * d^2 (its gradient is the unbiased KL gradient)."""
    return 0.5 * (logprob - ref_logprob).square()


@KL_ESTIMATORS.register("low_var_kl")
@KL_ESTIMATORS.register("k3")
def _kl_k3(logprob: torch.Tensor, ref_logprob: torch.Tensor) -> torch.Tensor:
    """k3: ratio - log(ratio) - 1 with ratio = pi_ref / pi; clamps keep exp() and the value finite."""
    log_ratio = (ref_logprob - logprob).clamp(-20.0, 20.0)
    return (torch.exp(log_ratio) - log_ratio - 1.0).clamp(-10.0, 10.0)


@KL_ESTIMATORS.register("full")
def _kl_full(logprob: torch.Tensor, ref_logprob: torch.Tensor) -> torch.Tensor:
    """Exact KL from (B, R, V) log-distributions: sum_v p(v) * (log p(v) - log p_ref(v))."""
    if logprob.dim() < 3 or logprob.shape != ref_logprob.shape:
        raise ValueError(
            "kl_penalty 'full' needs full log-distributions of shape (B, R, V) for both policies "
            f"(log_softmax of the logits); got {tuple(logprob.shape)} and {tuple(ref_logprob.shape)}. "
            "Per-token log-probs (B, R) only support kl, abs, mse, low_var_kl (k1, k2, k3)."
        )
    return (logprob.exp() * (logprob - ref_logprob)).sum(dim=-1)


def kl_estimator_names() -> list[str]:
    """Every valid `kl_penalty` / `kl_loss_type` name: the registered estimators and their '+' forms."""
    base = KL_ESTIMATORS.names()
    return base + [f"{name}+" for name in base]


def kl_penalty(logprob: torch.Tensor, ref_logprob: torch.Tensor, kl_penalty: str) -> torch.Tensor:
    """Per-token KL(pi || pi_ref) estimate.

    Estimators (d = logprob - ref_logprob):
        kl (k1): d.  abs: |d|.  mse (k2): 0.5 * d^2.
        low_var_kl (k3): exp(-d) + d - 1, clamped to [-10, 10] (log-ratio clamped to [-20, 20]).
        full: sum_v p(v) * (log p(v) - log p_ref(v)); needs (B, R, V) log-distributions (log_softmax),
            raises ValueError when given per-token log-probs.
    A '+' suffix (e.g. 'low_var_kl+') is straight-through: the forward value of the named estimator
    with the gradient of mse (k2), i.e. k + (mse - mse.detach()), which is unbiased for the KL gradient.
    'mse+' equals 'mse', and 'full+' equals 'full': the exact KL already has the exact gradient.

    Args:
        logprob: (B, R) actor log-probs of the sampled tokens, or (B, R, V) for 'full'.
        ref_logprob: same shape, reference policy.
        kl_penalty: estimator name, one of `kl_estimator_names()`.

    Returns:
        (B, R) per-token estimate.
    """
    name = kl_penalty
    straight_through = name.endswith("+")
    base = name[:-1] if straight_through else name
    if base not in KL_ESTIMATORS:
        close = difflib.get_close_matches(name, kl_estimator_names(), n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"Unknown kl_penalty {name!r}. Valid: {kl_estimator_names()}.{hint}")
    value = KL_ESTIMATORS.get(base)(logprob, ref_logprob)
    if not straight_through or base == "full":
        return value
    mse = _kl_k2(logprob, ref_logprob)
    return value.detach() + (mse - mse.detach())


class FixedKLController:
    """Constant KL coefficient (`algorithm.kl_ctrl.type=fixed`)."""

    def __init__(self, kl_coef: float) -> None:
        self.value = float(kl_coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        """No-op: the coefficient stays fixed."""


class AdaptiveKLController:
    """Adaptive KL coefficient (Ziegler et al. 2019), `algorithm.kl_ctrl.type=adaptive`.

    value <- value * (1 + clip(current_kl / target_kl - 1, -0.2, 0.2) * n_steps / horizon).
    """

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: float) -> None:
        if horizon <= 0:
            raise ValueError(f"algorithm.kl_ctrl.horizon must be > 0 for the adaptive controller, got {horizon}")
        if target_kl <= 0:
            raise ValueError(f"algorithm.kl_ctrl.target_kl must be > 0 for the adaptive controller, got {target_kl}")
        self.value = float(init_kl_coef)
        self.target = float(target_kl)
        self.horizon = float(horizon)

    def update(self, current_kl: float, n_steps: int) -> None:
        """Moves the coefficient toward keeping `current_kl` near the target."""
        error = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon


def get_kl_controller(kl_ctrl: Any) -> FixedKLController | AdaptiveKLController:
    """Builds the controller from `algorithm.kl_ctrl` (fields type, kl_coef, target_kl, horizon)."""
    kind = kl_ctrl.type
    if kind == "fixed":
        return FixedKLController(kl_coef=kl_ctrl.kl_coef)
    if kind == "adaptive":
        return AdaptiveKLController(
            init_kl_coef=kl_ctrl.kl_coef, target_kl=kl_ctrl.target_kl, horizon=kl_ctrl.horizon
        )
    raise ValueError(f"algorithm.kl_ctrl.type={kind!r} is invalid: must be one of ['adaptive', 'fixed']")


def apply_kl_penalty(
    token_level_scores: torch.Tensor,
    old_log_prob: torch.Tensor,
    ref_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    kl_ctrl: FixedKLController | AdaptiveKLController,
    kl_penalty: str = "kl",
) -> tuple[torch.Tensor, dict[str, float]]:
    """In-reward KL (`algorithm.use_kl_in_reward`): rewards = scores - beta * KL per token.

    Also updates `kl_ctrl` with the batch KL (mean over rows of the per-row token-mean KL), with
    n_steps = B.

    Args:
        token_level_scores: (B, R). old_log_prob: (B, R). ref_log_prob: (B, R). response_mask: (B, R).
        kl_ctrl: controller giving beta (`.value`, read before the update).
        kl_penalty: estimator name (see `kl_penalty`).

    Returns:
        token_level_rewards (B, R), metrics {"actor/reward_kl_penalty", "actor/reward_kl_penalty_coeff"}.
    """
    kld = _estimate(old_log_prob, ref_log_prob, kl_penalty) * response_mask
    beta = kl_ctrl.value
    token_level_rewards = token_level_scores - beta * kld
    current_kl = float(masked_mean(kld, response_mask, axis=-1).mean())
    kl_ctrl.update(current_kl=current_kl, n_steps=token_level_scores.shape[0])
    return token_level_rewards, {"actor/reward_kl_penalty": current_kl, "actor/reward_kl_penalty_coeff": beta}


_estimate = kl_penalty  # `apply_kl_penalty` has a parameter named like the function
