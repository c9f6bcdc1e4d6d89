"""KL estimators between the actor and the reference policy, KL controllers, in-reward KL penalty.

Shapes: B = batch rows, R = response length, V = vocabulary.
"""

from __future__ import annotations

from typing import Any

import torch

from rlpost.utils.masked import masked_mean

KL_ESTIMATORS = ("kl", "abs", "mse", "low_var_kl", "full")


def _kl_value(logprob: torch.Tensor, ref_logprob: torch.Tensor, name: str) -> torch.Tensor:
    """Per-token value of one estimator (no straight-through handling)."""
    if name in ("kl", "k1"):
        return logprob - ref_logprob
    if name == "abs":
        return (logprob - ref_logprob).abs()
    if name in ("mse", "k2"):
        return 0.5 * (logprob - ref_logprob).square()
    if name in ("low_var_kl", "k3"):
        # k3 = ratio - log(ratio) - 1 with ratio = pi_ref / pi; clamps keep exp() and the value finite.
        log_ratio = (ref_logprob - logprob).clamp(-20.0, 20.0)
        return (torch.exp(log_ratio) - log_ratio - 1.0).clamp(-10.0, 10.0)
    if name == "full":
        if logprob.dim() < 3 or logprob.shape != ref_logprob.shape:
            raise ValueError(
                "kl_penalty 'full' needs full log-distributions of shape (B, R, V) for both policies "
                f"(log_softmax of the logits); got {tuple(logprob.shape)} and {tuple(ref_logprob.shape)}. "
                "Per-token log-probs (B, R) only support kl, abs, mse, low_var_kl."
            )
        return (logprob.exp() * (logprob - ref_logprob)).sum(dim=-1)
    raise ValueError(
        f"Unknown kl_penalty {name!r}. Valid: {list(KL_ESTIMATORS)} (optionally with a '+' suffix)."
    )


def kl_penalty(logprob: torch.Tensor, ref_logprob: torch.Tensor, kl_penalty: str) -> torch.Tensor:
    """Per-token KL(pi || pi_ref) estimate.

    Estimators (d = logprob - ref_logprob):
        kl (k1): d.  abs: |d|.  mse (k2): 0.5 * d^2.
        low_var_kl (k3): exp(-d) + d - 1, clamped to [-10, 10] (log-ratio clamped to [-20, 20]).
        full: sum_v p(v) * (log p(v) - log p_ref(v)); needs (B, R, V) log-distributions (log_softmax),
            raises ValueError when given per-token log-probs.
    A '+' suffix (e.g. 'low_var_kl+') is straight-through: the forward value of the named estimator
    with the gradient of mse (k2), i.e. k + (mse - mse.detach()), which is unbiased for the KL gradient.

    Args:
        logprob: (B, R) actor log-probs of the sampled tokens, or (B, R, V) for 'full'.
        ref_logprob: same shape, reference policy.
        kl_penalty: estimator name.

    Returns:
        (B, R) per-token estimate.
    """
    name = kl_penalty
    if name.endswith("+"):
        base = name[:-1]
        if base == "full":
            raise ValueError("kl_penalty 'full+' is not defined: the '+' gradient uses per-token log-probs")
        value = _kl_value(logprob, ref_logprob, base)
        mse = _kl_value(logprob, ref_logprob, "mse")
        return value.detach() + (mse - mse.detach())
    return _kl_value(logprob, ref_logprob, name)


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
