"""Advantage estimators, selected by `algorithm.adv_estimator`.

Shapes: B = batch rows (prompts x n responses), R = response length.

Calling convention: every registered estimator is called by keyword with the same fields,
    fn(token_level_rewards=..., response_mask=..., values=..., index=..., reward_baselines=...,
       gamma=..., lam=..., norm_adv_by_std_in_grpo=..., epsilon=..., config=..., non_tensor_batch=...,
       old_log_probs=..., sum_pi_squared=..., rollout_is_weights=..., rollout_log_probs=...)
and takes what it needs, absorbing the rest through `**kwargs`; `compute_advantage` does that call.
A custom estimator registered with `@register_adv_est(name)` must accept the same keywords. Each
returns `(advantages, returns)`, both (B, R) and zero where `response_mask` is 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any, Callable

import numpy as np
import torch

from rlpost.utils.masked import masked_whiten
from rlpost.utils.registry import Registry

AdvEstimatorFn = Callable[..., tuple[torch.Tensor, torch.Tensor]]
ADV_ESTIMATORS = Registry("advantage estimator")


class AdvantageEstimator(str, Enum):
    """Names accepted by `algorithm.adv_estimator`."""

    GAE = "gae"
    GRPO = "grpo"
    REINFORCE_PLUS_PLUS = "reinforce_plus_plus"
    REINFORCE_PLUS_PLUS_BASELINE = "reinforce_plus_plus_baseline"
    REMAX = "remax"
    RLOO = "rloo"
    OPO = "opo"
    GPG = "gpg"
    GRPO_PASSK = "grpo_passk"
    GRPO_VECTORIZED = "grpo_vectorized"
    RLOO_VECTORIZED = "rloo_vectorized"
    GDPO = "gdpo"
    OPTIMAL_TOKEN_BASELINE = "optimal_token_baseline"
    TIR_OPTIMAL_TOKEN_BASELINE = "tir_optimal_token_baseline"
    CODAPO = "codapo"  # registered by rlpost.algos.codapo


@dataclass(frozen=True)
class EstimatorNeeds:
    """What an estimator needs of the run, declared where it is registered and read by the start-up rules, the
    role planning, the dry-run plan and the trainer (never by comparing estimator names).

    Attributes:
        critic: a value model (the critic worker group).
        groups: groups of `rollout.n` > 1 responses per prompt (the group's rows share a uid).
        sum_pi_squared: the actor's log-prob pass adds sum_v p(v)^2 per token (`actor.calculate_sum_pi_squared`).
        step_features: names of the step features it runs (`rlpost.trainer.ppo.features`), e.g. a greedy
            baseline generation or a second, focused step per batch.
        steps_per_batch: training steps each data-loader batch makes.
        reward_components: the reward function returns named components (`algorithm.gdpo_reward_keys`).
        plan_line: the dry-run plan's line for it, from the `algorithm` config (None: no line of its own).
    """

    critic: bool = False
    groups: bool = False
    sum_pi_squared: bool = False
    step_features: tuple[str, ...] = ()
    steps_per_batch: int = 1
    reward_components: bool = False
    plan_line: Callable[[Any], str] | None = None


_NEEDS: dict[str, EstimatorNeeds] = {}


def register_adv_est(name: str | AdvantageEstimator, needs: EstimatorNeeds | None = None
                     ) -> Callable[[AdvEstimatorFn], AdvEstimatorFn]:
    """Decorator registering an advantage estimator under `name` (see the module calling convention), with
    what it needs of the run (`EstimatorNeeds`; none by default)."""
    key = name.value if isinstance(name, Enum) else name
    _NEEDS[key] = needs or _NEEDS.get(key) or EstimatorNeeds()
    return ADV_ESTIMATORS.register(name)


def estimator_needs(name: str | AdvantageEstimator) -> EstimatorNeeds:
    """What the estimator registered under `name` needs (nothing for a name not registered: the config's choice
    check names those)."""
    return _NEEDS.get(name.value if isinstance(name, Enum) else name, EstimatorNeeds())


def get_adv_estimator_fn(name: str | AdvantageEstimator) -> AdvEstimatorFn:
    """The estimator registered under `name`; a ValueError lists valid names otherwise."""
    return ADV_ESTIMATORS.get(name)


def _group_ids(index: Any, batch_size: int) -> torch.Tensor:
    """(B,) long group id per row from an array of uids (one uid per prompt)."""
    if index is None:
        raise ValueError("this advantage estimator needs `index` (the per-row uid array) to form groups")
    arr = np.asarray(index)
    if arr.shape[0] != batch_size:
        raise ValueError(f"index has {arr.shape[0]} entries but the batch has {batch_size} rows")
    _, inverse = np.unique(arr, return_inverse=True)
    return torch.as_tensor(inverse.reshape(-1), dtype=torch.long)


def _per_row_group_sum(x: torch.Tensor, gid: torch.Tensor) -> torch.Tensor:
    """(B,) sum of `x` over each row's group, repeated on every row of the group."""
    sums = torch.zeros(int(gid.max()) + 1, dtype=x.dtype, device=x.device)
    return sums.index_add_(0, gid.to(x.device), x)[gid.to(x.device)]


def _group_mean_std(scores: torch.Tensor, gid: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Per-row group (mean, unbiased std, size); size-1 groups get mean 0, std 1 (GRPO convention)."""
    count = _per_row_group_sum(torch.ones_like(scores), gid)
    mean = _per_row_group_sum(scores, gid) / count
    sq = _per_row_group_sum((scores - mean) ** 2, gid)
    std = torch.sqrt(sq / (count - 1).clamp_min(1))
    single = count == 1
    mean = torch.where(single, torch.zeros_like(mean), mean)
    std = torch.where(single, torch.ones_like(std), std)
    return mean, std, count


def _group_reduce(x: torch.Tensor, gid: torch.Tensor, n_groups: int, reduce: str) -> torch.Tensor:
    """(G,) per-group "amax" / "amin" of x (B,) over the rows of each group."""
    out = torch.empty(n_groups, dtype=x.dtype, device=x.device)
    return out.scatter_reduce_(0, gid, x, reduce=reduce, include_self=False)


def _check_rewards(token_level_rewards: torch.Tensor, response_mask: torch.Tensor) -> None:
    if token_level_rewards.shape != response_mask.shape or token_level_rewards.dim() != 2:
        raise ValueError(
            f"token_level_rewards {tuple(token_level_rewards.shape)} and response_mask "
            f"{tuple(response_mask.shape)} must both be (B, R)"
        )


@register_adv_est(AdvantageEstimator.GAE, EstimatorNeeds(critic=True))
def compute_gae_advantage_return(
    token_level_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float = 1.0,
    lam: float = 1.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation (Schulman et al. 2016), whitened over the batch.

    delta_t = r_t + gamma * V_{t+1} - V_t;  A_t = delta_t + gamma * lam * A_{t+1}.
    Masked positions (mask 0, e.g. tool-output tokens inside a response) are skipped: the next value
    and the running A are carried across them unchanged. returns = A (before whitening) + V.

    Args:
        token_level_rewards: (B, R).
        values: (B, R) critic values.
        response_mask: (B, R) 1 on response tokens.
        gamma: discount. lam: GAE lambda.

    Returns:
        advantages (B, R) whitened over valid tokens, returns (B, R); both zero where masked.
    """
    if values is None:
        raise ValueError("adv_estimator 'gae' needs `values` from the critic")
    _check_rewards(token_level_rewards, response_mask)
    with torch.no_grad():
        mask = response_mask.to(values.dtype)
        next_value = torch.zeros_like(values[:, 0])
        last_gae = torch.zeros_like(values[:, 0])
        reversed_adv = []
        for t in reversed(range(values.shape[1])):
            delta = token_level_rewards[:, t] + gamma * next_value - values[:, t]
            gae_t = delta + gamma * lam * last_gae
            next_value = torch.where(mask[:, t].bool(), values[:, t], next_value)
            last_gae = torch.where(mask[:, t].bool(), gae_t, last_gae)
            reversed_adv.append(last_gae)
        advantages = torch.stack(reversed_adv[::-1], dim=1)
        returns = (advantages + values) * mask
        advantages = masked_whiten(advantages, mask) * mask
    return advantages, returns


@register_adv_est(AdvantageEstimator.GRPO, EstimatorNeeds(groups=True))
@register_adv_est(AdvantageEstimator.GRPO_VECTORIZED, EstimatorNeeds(groups=True))
def compute_grpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO outcome advantage (Shao et al. 2024): A_i = (s_i - mean_g) / (std_g + eps).

    s_i = sum of the row's token rewards; g = the rows sharing `index[i]`; std is unbiased (as
    `torch.std`). A group of one gets mean 0 and std 1. With `norm_adv_by_std_in_grpo=False` this is
    Dr.GRPO: A_i = s_i - mean_g. Group statistics are scatter-adds over group ids (no loop over
    groups), so verl's `grpo_vectorized` is registered to this same function.

    Args:
        token_level_rewards: (B, R). response_mask: (B, R).
        index: (B,) uid per row. epsilon: added to the std.

    Returns:
        (advantages, advantages), each (B, R): the row's value on every valid token.
    """
    _check_rewards(token_level_rewards, response_mask)
    with torch.no_grad():
        scores = token_level_rewards.sum(dim=-1)
        mean, std, _ = _group_mean_std(scores, _group_ids(index, scores.shape[0]))
        adv = scores - mean
        if norm_adv_by_std_in_grpo:
            adv = adv / (std + epsilon)
        adv = adv.unsqueeze(-1) * response_mask
    return adv, adv


@register_adv_est(AdvantageEstimator.RLOO, EstimatorNeeds(groups=True))
@register_adv_est(AdvantageEstimator.RLOO_VECTORIZED, EstimatorNeeds(groups=True))
def compute_rloo_outcome_advantage(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: np.ndarray, **kwargs: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """RLOO (Ahmadian et al. 2024): A_i = s_i - mean of the other rows of its group.

    Equivalently n/(n-1) * (s_i - mean_g). A group of one keeps its raw score (no baseline), as
    verl's loop `rloo`. Computed with scatter-adds (no loop over groups); verl's `rloo_vectorized`
    is registered to this same function (verl's own vectorized copy gives a group of one 0 instead).

    Returns:
        (advantages, advantages), each (B, R).
    """
    _check_rewards(token_level_rewards, response_mask)
    with torch.no_grad():
        scores = token_level_rewards.sum(dim=-1)
        gid = _group_ids(index, scores.shape[0])
        count = _per_row_group_sum(torch.ones_like(scores), gid)
        others_mean = (_per_row_group_sum(scores, gid) - scores) / (count - 1).clamp_min(1)
        adv = torch.where(count > 1, scores - others_mean, scores)
        adv = adv.unsqueeze(-1) * response_mask
    return adv, adv


@register_adv_est(AdvantageEstimator.GRPO_PASSK, EstimatorNeeds(groups=True))
def compute_grpo_passk_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pass@k GRPO (Chen et al. 2025): only the best row of each group learns, A = s_max - s_second.

    The other rows of the group get 0; with `norm_adv_by_std_in_grpo` the best row's advantage is
    divided by (unbiased group std + epsilon). Ties for the best: the first such row is chosen (and
    its advantage is 0). Every group needs at least 2 rows.

    Returns:
        (advantages, advantages), each (B, R).
    """
    _check_rewards(token_level_rewards, response_mask)
    with torch.no_grad():
        scores = token_level_rewards.sum(dim=-1)
        gid = _group_ids(index, scores.shape[0]).to(scores.device)
        _, std, count = _group_mean_std(scores, gid)
        if bool((count < 2).any()):
            raise ValueError("adv_estimator 'grpo_passk' needs at least 2 responses per prompt (rollout.n >= 2)")
        n_groups = int(gid.max()) + 1
        best = _group_reduce(scores, gid, n_groups, "amax")
        rows = torch.arange(scores.shape[0], device=scores.device)
        at_best = torch.where(scores == best[gid], rows, torch.full_like(rows, scores.shape[0]))
        best_row = _group_reduce(at_best, gid, n_groups, "amin")  # first row reaching the max
        is_best = rows == best_row[gid]
        second = _group_reduce(scores.masked_fill(is_best, float("-inf")), gid, n_groups, "amax")
        adv = (best - second)[gid]
        if norm_adv_by_std_in_grpo:
            adv = adv / (std + epsilon)
        adv = torch.where(is_best, adv, torch.zeros_like(adv)).unsqueeze(-1) * response_mask
    return adv, adv


@register_adv_est(AdvantageEstimator.REINFORCE_PLUS_PLUS)
def compute_reinforce_plus_plus_outcome_advantage(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, config: Any = None, gamma: float | None = None,
    **kwargs: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ (Hu 2025): discounted return G_t = r_t + gamma * G_{t'} over the response's own tokens, whitened
    over the batch.

    t' is the next token with `response_mask` 1: masked tokens inside a response (a multi-turn rollout's tool or
    user turns) are not actions, so the return passes across them undiscounted and earlier turns get the outcome
    reward; they get return 0 themselves. Trailing padding stays 0 (the scan starts from 0 at the right end).

    Args:
        config: the algorithm config; `config.gamma` is the discount when `gamma` is not given (verl's call).
        gamma: the discount (rlpost's `compute_advantage` passes it); 1.0 when neither is given.

    Returns:
        advantages (B, R) = masked_whiten(returns), returns (B, R); both zero where masked.
    """
    if gamma is None:
        gamma = float(config.gamma) if config is not None and getattr(config, "gamma", None) is not None else 1.0
    _check_rewards(token_level_rewards, response_mask)
    with torch.no_grad():
        mask = response_mask.to(token_level_rewards.dtype)
        running = torch.zeros_like(token_level_rewards[:, 0])
        returns = torch.zeros_like(token_level_rewards)
        for t in reversed(range(token_level_rewards.shape[1])):
            running = torch.where(mask[:, t] > 0, token_level_rewards[:, t] + gamma * running, running)
            returns[:, t] = running * mask[:, t]
        advantages = masked_whiten(returns, mask) * mask
    return advantages, returns


@register_adv_est(AdvantageEstimator.REINFORCE_PLUS_PLUS_BASELINE, EstimatorNeeds(groups=True))
def compute_reinforce_plus_plus_baseline_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ with a group-mean baseline: A = whiten_batch(s_i - mean_g) over valid tokens.

    A group of one has baseline 0. `epsilon` is unused (kept for verl's signature).

    Returns:
        (advantages, advantages), each (B, R).
    """
    _check_rewards(token_level_rewards, response_mask)
    with torch.no_grad():
        scores = token_level_rewards.sum(dim=-1)
        mean, _, _ = _group_mean_std(scores, _group_ids(index, scores.shape[0]))
        adv = (scores - mean).unsqueeze(-1) * response_mask
        adv = masked_whiten(adv, response_mask) * response_mask
    return adv, adv


@register_adv_est(AdvantageEstimator.REMAX, EstimatorNeeds(step_features=("remax_baseline",)))
def compute_remax_outcome_advantage(
    token_level_rewards: torch.Tensor,
    reward_baselines: torch.Tensor,
    response_mask: torch.Tensor,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """ReMax (Li et al. 2023): A_t = G_t - b, G_t = undiscounted reward-to-go, b = greedy reward.

    Args:
        token_level_rewards: (B, R). reward_baselines: (B,) score of the greedy response.
        response_mask: (B, R).

    Returns:
        advantages (B, R), returns (B, R); both zero where masked.
    """
    if reward_baselines is None:
        raise ValueError("adv_estimator 'remax' needs `reward_baselines` (the greedy-response scores)")
    _check_rewards(token_level_rewards, response_mask)
    with torch.no_grad():
        returns = (token_level_rewards * response_mask).flip(-1).cumsum(-1).flip(-1)
        advantages = (returns - reward_baselines.reshape(-1, 1)) * response_mask
    return advantages, returns


@register_adv_est(AdvantageEstimator.OPO, EstimatorNeeds(groups=True))
def compute_opo_outcome_advantage(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: np.ndarray, **kwargs: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """OPO (Hao et al. 2025), optimal baseline for on-policy RL: length-weighted group mean.

    b_g = sum_j(L_j * s_j) / sum_j(L_j) over the group, L_j = valid tokens of row j; A_i = s_i - b_g.
    A group of one has baseline 0.

    Returns:
        (advantages, advantages), each (B, R).
    """
    _check_rewards(token_level_rewards, response_mask)
    with torch.no_grad():
        scores = token_level_rewards.sum(dim=-1)
        lengths = response_mask.sum(dim=-1).to(scores.dtype)
        gid = _group_ids(index, scores.shape[0])
        count = _per_row_group_sum(torch.ones_like(scores), gid)
        baseline = _per_row_group_sum(lengths * scores, gid) / _per_row_group_sum(lengths, gid).clamp_min(1)
        baseline = torch.where(count > 1, baseline, torch.zeros_like(baseline))
        adv = (scores - baseline).unsqueeze(-1) * response_mask
    return adv, adv


@register_adv_est(AdvantageEstimator.GPG, EstimatorNeeds(groups=True))
def compute_gpg_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    f_norm: float = 1.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GPG, Group Policy Gradient (Chu et al. 2025): A_i = alpha * (s_i - mean_g) / F_norm.

    alpha = B / (B - M), M = rows whose group has all-equal scores (they give zero gradient), which
    rescales the batch-mean loss to the rows that carry signal. F_norm = `f_norm` (paper: 1).
    A group of one has mean 0 (like GRPO) and counts as a signal row. `epsilon` guards F_norm.

    Returns:
        (advantages, advantages), each (B, R).
    """
    _check_rewards(token_level_rewards, response_mask)
    with torch.no_grad():
        scores = token_level_rewards.sum(dim=-1)
        gid = _group_ids(index, scores.shape[0])
        mean, std, count = _group_mean_std(scores, gid)
        degenerate = (count > 1) & (std == 0)
        batch = scores.shape[0]
        alpha = batch / max(batch - int(degenerate.sum()), 1)
        adv = alpha * (scores - mean) / max(f_norm, epsilon)
        adv = adv.unsqueeze(-1) * response_mask
    return adv, adv


@register_adv_est(AdvantageEstimator.GDPO, EstimatorNeeds(groups=True, reward_components=True,
                                                             step_features=("gdpo_metrics",)))
def compute_gdpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
    config: Any = None,
    non_tensor_batch: dict[str, np.ndarray] | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GDPO (group reward-decoupled normalisation): GRPO's group normalisation applied to each reward
    component on its own, the components summed with weights, then whitened over the batch.

    c_k,i = row i's value of component k (`non_tensor_batch[key_k]`, from the reward function's dict);
    A_i = sum_k w_k * (c_k,i - mean_g c_k) / (std_g c_k + eps) (no division with norm_adv_by_std_in_grpo=False),
    then whitened over the valid tokens. Keys: `algorithm.gdpo_reward_keys`, weights
    `algorithm.gdpo_reward_weights` (null: 1.0 each). The row's own total score is not used.

    Raises:
        ValueError: no keys configured, weights of another length, or a component missing from the batch.
    """
    keys = list(getattr(config, "gdpo_reward_keys", None) or [])
    weights = list(getattr(config, "gdpo_reward_weights", None) or [1.0] * len(keys))
    if not keys or len(weights) != len(keys):
        raise ValueError(f"adv_estimator=gdpo needs algorithm.gdpo_reward_keys (got {keys}) and as many "
                         f"algorithm.gdpo_reward_weights (got {weights}) or null")
    fields = non_tensor_batch or {}
    missing = [k for k in keys if k not in fields]
    if missing:
        raise ValueError(f"gdpo reward components {missing} are not in the batch: the reward function must return "
                         f"them in its dict beside 'score' (the batch has {sorted(fields)})")
    gid = _group_ids(index, token_level_rewards.shape[0])
    with torch.no_grad():
        total = torch.zeros(token_level_rewards.shape[0], dtype=torch.float32)
        for key, weight in zip(keys, weights):
            values = torch.as_tensor(np.asarray(fields[key], dtype=np.float32))
            mean, std, _ = _group_mean_std(values, gid)
            part = values - mean
            total += float(weight) * (part / (std + epsilon) if norm_adv_by_std_in_grpo else part)
        adv = masked_whiten(total.unsqueeze(-1).expand_as(response_mask).to(torch.float32), response_mask)
        adv = adv * response_mask
    return adv, adv


def compute_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    adv_estimator: str | AdvantageEstimator,
    *,
    values: torch.Tensor | None = None,
    index: np.ndarray | None = None,
    reward_baselines: torch.Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    norm_adv_by_std_in_grpo: bool = True,
    epsilon: float = 1e-6,
    config: Any = None,
    non_tensor_batch: dict[str, np.ndarray] | None = None,
    old_log_probs: torch.Tensor | None = None,
    sum_pi_squared: torch.Tensor | None = None,
    rollout_is_weights: torch.Tensor | None = None,
    rollout_log_probs: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Runs the estimator named `adv_estimator` with the uniform keyword call (module docstring).

    Args:
        token_level_rewards: (B, R). response_mask: (B, R).
        adv_estimator: a registered name (`algorithm.adv_estimator`).
        values: (B, R) critic values (gae). index: (B,) uids (group estimators).
        reward_baselines: (B,) greedy scores (remax). gamma, lam, norm_adv_by_std_in_grpo, epsilon:
            from `algorithm.*`. config: the `algorithm` config, passed through for custom estimators.
        non_tensor_batch: the batch's per-row fields (the reward's extra values: gdpo's components).
        old_log_probs, sum_pi_squared, rollout_is_weights, rollout_log_probs: (B, R) from the actor's log-prob
            pass, rollout correction and the engine (the optimal-token-baseline estimators, codapo), or None.

    Returns:
        advantages (B, R), returns (B, R).
    """
    fn = get_adv_estimator_fn(adv_estimator)
    return fn(
        token_level_rewards=token_level_rewards,
        response_mask=response_mask,
        values=values,
        index=index,
        reward_baselines=reward_baselines,
        gamma=gamma,
        lam=lam,
        norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo,
        epsilon=epsilon,
        config=config,
        non_tensor_batch=non_tensor_batch,
        old_log_probs=old_log_probs,
        sum_pi_squared=sum_pi_squared,
        rollout_is_weights=rollout_is_weights,
        rollout_log_probs=rollout_log_probs,
    )


# verl's optimal-token-baseline estimators live in their own module; imported here so that importing this module
# registers every built-in estimator (and the names stay importable from here, as in verl's core_algos).
from rlpost.algos.otb import (  # noqa: E402, F401
    compute_optimal_token_baseline_advantage, compute_tir_optimal_token_baseline_advantage)
