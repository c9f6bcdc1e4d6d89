"""CoDaPO's question values (confidence x difficulty), the weight CoDaPO puts on GRPO's advantages, and the questions
its focused phase samples again. Pure tensor maths; the two-phase cycle lives in the trainer
(`rlpost.trainer.ppo.codapo_cycle`).

For a question q with G responses o_i of T_i tokens, y_i = 1 when response i is correct:
    c_q = exp(mean_i (1/T_i) sum_t log pi(o_i,t))        confidence
    d_q = 1 - mean_i y_i                                   difficulty
    v_q = c_q (1 - 4 (d_q - 1/2)^2)                        largest for questions solved about half the time
and the advantage is (v_q + delta) * GRPO's advantage.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from rlpost.algos.advantages import (AdvantageEstimator, _group_ids, _per_row_group_sum,
                                     compute_grpo_outcome_advantage, EstimatorNeeds, register_adv_est)

# verl's documented defaults for the keys its YAML leaves null
DEFAULT_TOP_K, DEFAULT_WEIGHT_OFFSET, DEFAULT_ACCURACY_KEY = 4, 0.1, "acc"


def codapo_settings(config: Any) -> tuple[int, float, str]:
    """(top_k, weight_offset, accuracy_key) of the `algorithm` config; null keys take verl's defaults."""
    def pick(name: str, default: Any) -> Any:
        value = getattr(config, name, None)
        return default if value is None else value

    return (int(pick("codapo_top_k", DEFAULT_TOP_K)), float(pick("codapo_weight_offset", DEFAULT_WEIGHT_OFFSET)),
            str(pick("codapo_accuracy_key", DEFAULT_ACCURACY_KEY)))


def correct_flags(values: Any) -> torch.Tensor:
    """(B,) 1.0 where the reward's accuracy value is 1 (correct), else 0.0."""
    arr = np.asarray(values, dtype=object)
    return torch.tensor([1.0 if v is not None and v == 1 else 0.0 for v in arr], dtype=torch.float32)


def confidence_log_probs(rollout_log_probs: torch.Tensor | None, old_log_probs: torch.Tensor | None
                         ) -> torch.Tensor | None:
    """The generating policy's token log-probs: the engine's own when the rollout returned them, else the actor's
    `old_log_probs` of the same, not yet updated, weights."""
    return rollout_log_probs if rollout_log_probs is not None else old_log_probs


def question_values(correct: torch.Tensor, log_probs: torch.Tensor, response_mask: torch.Tensor,
                    index: Any) -> torch.Tensor:
    """(B,) the value v_q of each row's question (every row of a group gets the same value).

    Args:
        correct: (B,) 1.0 for a correct response. log_probs: (B, R) the generating policy's token log-probs.
        response_mask: (B, R). index: (B,) the rows' prompt uids.
    """
    mask = response_mask.to(torch.float32)
    tokens = mask.sum(-1)
    has_tokens = (tokens > 0).to(torch.float32)  # a response rejected whole (rollout correction) has no confidence
    mean_logp = (log_probs.float() * mask).sum(-1) / tokens.clamp_min(1.0)
    gid = _group_ids(index, correct.shape[0])
    count = _per_row_group_sum(torch.ones_like(mean_logp), gid)
    group_logp = _per_row_group_sum(mean_logp * has_tokens, gid) / _per_row_group_sum(has_tokens, gid).clamp_min(1.0)
    difficulty = 1.0 - _per_row_group_sum(correct.float(), gid) / count
    return group_logp.exp() * (1.0 - 4.0 * (difficulty - 0.5) ** 2)


def top_questions(values: torch.Tensor, index: Any, k: int, order: Any = None) -> list[Any]:
    """The uids of the k questions of highest value; ties go to the question earlier in `order` (the batch's
    prompt order; default: first appearance in `index`)."""
    seen: dict[Any, float] = {}
    for uid, v in zip(np.asarray(index, dtype=object), values.tolist()):
        seen.setdefault(uid, v)
    ranked = list(order) if order is not None else list(seen)
    rank = {uid: i for i, uid in enumerate(ranked)}
    return sorted(seen, key=lambda uid: (-seen[uid], rank[uid]))[:k]


def round_robin(rows: list[int], size: int) -> list[int]:
    """`rows` repeated in turn until there are `size` of them."""
    return [rows[i % len(rows)] for i in range(size)]


def plan_line(config: Any) -> str:
    """The dry-run plan's line: what CoDaPO does with the `algorithm` config's settings."""
    top_k, offset, key = codapo_settings(config)
    return (f"codapo: advantages x (question value + {offset}), correctness from the reward's {key!r}; each "
            f"step on a data-loader batch is followed by a focused step on its top {top_k} questions")


@register_adv_est(AdvantageEstimator.CODAPO, EstimatorNeeds(groups=True, steps_per_batch=2,
                                                             step_features=("codapo_cycle",), plan_line=plan_line))
def compute_codapo_outcome_advantage(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: np.ndarray,
                                     epsilon: float = 1e-6, norm_adv_by_std_in_grpo: bool = True, config: Any = None,
                                     non_tensor_batch: dict[str, np.ndarray] | None = None,
                                     old_log_probs: torch.Tensor | None = None,
                                     rollout_log_probs: torch.Tensor | None = None, **kwargs: Any
                                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """CoDaPO: GRPO's advantage of each response times (v_q + `algorithm.codapo_weight_offset`).

    Correctness is the reward's `algorithm.codapo_accuracy_key` value (1 = correct), not the score; confidence uses
    the engine's own log-probs when the rollout returned them (`rollout_log_probs`), else the actor's
    `old_log_probs` of the same, not yet updated, policy.

    Raises:
        ValueError: the accuracy key is missing from the batch, or no log-probs are given.
    """
    _, offset, key = codapo_settings(config)
    fields = non_tensor_batch or {}
    if key not in fields:
        raise ValueError(f"codapo reads correctness from the reward's {key!r} value (algorithm.codapo_accuracy_key), "
                         f"which the batch lacks (it has {sorted(fields)}): return it in the reward function's dict "
                         f"beside 'score', or use reward.reward_manager.name=dapo, which records a scorer's plain "
                         f"number as 'acc'")
    log_probs = confidence_log_probs(rollout_log_probs, old_log_probs)
    if log_probs is None:
        raise ValueError("codapo's confidence needs the policy's log-probs of the responses (old_log_probs)")
    adv, _ = compute_grpo_outcome_advantage(token_level_rewards, response_mask, index, epsilon,
                                            norm_adv_by_std_in_grpo)
    values = question_values(correct_flags(fields[key]), log_probs, response_mask, index)
    adv = adv * (values + offset).unsqueeze(-1)
    return adv, adv
