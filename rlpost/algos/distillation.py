"""On-policy distillation losses: the student samples, a teacher scores the same tokens, the student moves
towards the teacher.

Two families, chosen by `distillation.distillation_loss.loss_mode` (verl's names):

- single-sample estimators of the reverse KL(student || teacher) on the student's sampled tokens, from the
  two log-probs of each token: `k1` (`kl`), `abs`, `k2` (`mse`), `k3` (`low_var_kl`), the estimators of
  `rlpost.algos.kl`;
- divergences over the teacher's top-k tokens (`forward_kl_topk`, `reverse_kl_topk`, `jsd_topk`) from the two
  models' log-probs of those k tokens; with k = the vocabulary size they are the full-vocabulary divergences.

Either is a loss added to the actor's (`distillation_loss`), or, with `use_policy_gradient`, a per-token
reward whose negative divergence is the advantage of a policy-gradient step (`distillation_advantages`).
Pure tensor functions: no worker, engine or Ray.
"""

from __future__ import annotations

import math

import torch

from rlpost.algos.kl import kl_penalty
from rlpost.algos.losses import agg_loss
from rlpost.utils.registry import Registry

ESTIMATOR_MODES = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")
TOPK_MODES = ("forward_kl_topk", "reverse_kl_topk", "jsd_topk")
# A top-k entry outside the other model's support has log-prob -inf; clamping both sides to log(1e-8)
# keeps every term finite (inf - inf would be nan).
_TOPK_FLOOR = math.log(1e-8)

DISTILLATION_LOSSES = Registry("distillation loss mode")
for _name in (*ESTIMATOR_MODES, *TOPK_MODES):
    DISTILLATION_LOSSES.register(_name)("topk" if _name in TOPK_MODES else "estimator")


def is_topk_mode(loss_mode: str) -> bool:
    """True for the modes that read top-k distributions (B, R, k) instead of one log-prob per token."""
    return DISTILLATION_LOSSES.get(loss_mode) == "topk"


def _floor(log_probs: torch.Tensor, log_prob_min_clamp: float | None) -> torch.Tensor:
    return log_probs if log_prob_min_clamp is None else log_probs.clamp_min(float(log_prob_min_clamp))


def estimator_divergence(student_log_probs: torch.Tensor, teacher_log_probs: torch.Tensor, loss_mode: str,
                         log_prob_min_clamp: float | None = None, loss_max_clamp: float | None = None
                         ) -> torch.Tensor:
    """Per-token reverse-KL estimate on the student's sampled tokens.

    Args:
        student_log_probs: (B, R) log pi_student(y_t | y_<t) of the sampled tokens (with gradient for a loss).
        teacher_log_probs: (B, R) log pi_teacher of the same tokens.
        loss_mode: one of `ESTIMATOR_MODES` (k1 = log pi_s - log pi_t, k2 = half its square, k3 = r - log r - 1
            with r = pi_t / pi_s, abs = |k1|).
        log_prob_min_clamp: floor applied to both log-probs first (a token the teacher finds near-impossible
            would otherwise dominate), None for none.
        loss_max_clamp: ceiling of the per-token value, None for none.

    Returns:
        (B, R) per-token divergence.
    """
    if is_topk_mode(loss_mode):
        raise ValueError(f"loss_mode={loss_mode!r} reads top-k distributions: use topk_divergence")
    value = kl_penalty(_floor(student_log_probs, log_prob_min_clamp), _floor(teacher_log_probs, log_prob_min_clamp),
                       loss_mode)
    return value if loss_max_clamp is None else value.clamp_max(float(loss_max_clamp))


def _kl_rows(log_p: torch.Tensor, log_q: torch.Tensor) -> torch.Tensor:
    """sum_k p_k (log p_k - log q_k) over the last axis."""
    return (log_p.exp() * (log_p - log_q)).sum(dim=-1)


def topk_divergence(student_topk_log_probs: torch.Tensor, teacher_topk_log_probs: torch.Tensor, loss_mode: str,
                    jsd_beta: float = 0.5, loss_max_clamp: float | None = None) -> torch.Tensor:
    """Per-token divergence between the two models' log-probs of the same k tokens (the teacher's top-k).

    The k entries are not renormalised (the mass outside them is left out), so the sums can fall below 0;
    the result is clamped at 0 from below.

    Args:
        student_topk_log_probs: (B, R, k) log pi_student of the k tokens at each position.
        teacher_topk_log_probs: (B, R, k) log pi_teacher of the same tokens.
        loss_mode: `forward_kl_topk` (KL(teacher || student)), `reverse_kl_topk` (KL(student || teacher)) or
            `jsd_topk`: beta KL(teacher || m) + (1 - beta) KL(student || m), m = beta p_t + (1 - beta) p_s.
        jsd_beta: beta of `jsd_topk`.
        loss_max_clamp: ceiling of the per-token value, None for none.

    Returns:
        (B, R) per-token divergence, >= 0.
    """
    if student_topk_log_probs.shape != teacher_topk_log_probs.shape:
        raise ValueError(f"top-k log-probs differ in shape: student {tuple(student_topk_log_probs.shape)}, "
                         f"teacher {tuple(teacher_topk_log_probs.shape)}; both must cover the same k tokens")
    log_s = student_topk_log_probs.clamp_min(_TOPK_FLOOR)
    log_t = teacher_topk_log_probs.clamp_min(_TOPK_FLOOR)
    if loss_mode == "forward_kl_topk":
        value = _kl_rows(log_t, log_s)
    elif loss_mode == "reverse_kl_topk":
        value = _kl_rows(log_s, log_t)
    elif loss_mode == "jsd_topk":
        log_m = (jsd_beta * log_t.exp() + (1.0 - jsd_beta) * log_s.exp()).log()
        value = jsd_beta * _kl_rows(log_t, log_m) + (1.0 - jsd_beta) * _kl_rows(log_s, log_m)
    else:
        raise ValueError(f"loss_mode={loss_mode!r} is not a top-k mode; top-k modes: {list(TOPK_MODES)}")
    if loss_max_clamp is not None:
        value = value.clamp_max(float(loss_max_clamp))
    return value.clamp_min(0.0)


def mask_duplicate_ids(log_probs: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """`log_probs` with -inf at every entry whose id equals the next one's (ids sorted along the last axis), so
    an id in both models' top-k counts once.

    Args:
        log_probs: (..., m) log-probs of `ids`. ids: (..., m) sorted ascending.
    """
    dup = torch.nn.functional.pad(ids.diff(dim=-1), (0, 1), value=1).eq(0)
    return log_probs.masked_fill(dup, float("-inf"))


def merge_topk(at_student_ids: torch.Tensor, student_ids: torch.Tensor, own_log_probs: torch.Tensor,
               own_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The teacher's log-probs over the union of the student's and its own top-k (verl's top-k support).

    Args:
        at_student_ids: (B, R, k) the teacher's log-probs of the student's top-k ids `student_ids` (B, R, k).
        own_log_probs / own_ids: (B, R, k) the teacher's own top-k.

    Returns:
        (log_probs, ids), each (B, R, 2k), sorted by id; an id in both halves keeps one entry, the other at -inf.
    """
    ids, order = torch.cat([student_ids, own_ids], dim=-1).sort(dim=-1)
    log_probs = torch.cat([at_student_ids, own_log_probs], dim=-1).gather(-1, order)
    return mask_duplicate_ids(log_probs, ids), ids


def distillation_loss(student_log_probs: torch.Tensor, teacher_log_probs: torch.Tensor, response_mask: torch.Tensor,
                      loss_mode: str, loss_agg_mode: str = "token-mean", log_prob_min_clamp: float | None = None,
                      loss_max_clamp: float | None = None, jsd_beta: float = 0.5,
                      loss_scale_factor: float | None = None) -> torch.Tensor:
    """The distillation term of the actor's loss: the per-token divergence aggregated like the policy loss.

    Args:
        student_log_probs / teacher_log_probs: (B, R) for an estimator mode, (B, R, k) for a top-k mode.
        response_mask: (B, R) 1 on generated tokens.
        loss_mode, log_prob_min_clamp, loss_max_clamp, jsd_beta: see `estimator_divergence` / `topk_divergence`
            (the log-prob floor applies to the estimator modes).
        loss_agg_mode: `rlpost.algos.losses.agg_loss` mode; loss_scale_factor: its seq-mean-token-sum-norm divisor.

    Returns:
        scalar loss.
    """
    if is_topk_mode(loss_mode):
        per_token = topk_divergence(student_log_probs, teacher_log_probs, loss_mode, jsd_beta, loss_max_clamp)
    else:
        per_token = estimator_divergence(student_log_probs, teacher_log_probs, loss_mode, log_prob_min_clamp,
                                         loss_max_clamp)
    return agg_loss(per_token, response_mask, loss_agg_mode, loss_scale_factor=loss_scale_factor)


def distillation_advantages(old_log_probs: torch.Tensor, teacher_log_probs: torch.Tensor,
                            response_mask: torch.Tensor, loss_mode: str, coef: float = 1.0,
                            log_prob_min_clamp: float | None = None, loss_max_clamp: float | None = None,
                            task_advantages: torch.Tensor | None = None) -> torch.Tensor:
    """Per-token advantages of distillation as a policy gradient: minus the divergence at each token.

    With `loss_mode=k1` the advantage is log pi_teacher - log pi_student: tokens the teacher likes more than
    the student are pushed up. No discounting: each token's reward is its own (the divergence of later tokens
    is not summed in), as in on-policy distillation's per-token reverse KL.

    Args:
        old_log_probs: (B, R) the student's log-probs of its samples before the update (no gradient).
        teacher_log_probs: (B, R) the teacher's.
        response_mask: (B, R).
        loss_mode: an estimator mode (`ESTIMATOR_MODES`).
        coef: weight of the distillation advantage.
        log_prob_min_clamp / loss_max_clamp: see `estimator_divergence`.
        task_advantages: (B, R) the task reward's advantages to add (`use_task_rewards`), None for none.

    Returns:
        (B, R) advantages, 0 outside the response mask.
    """
    divergence = estimator_divergence(old_log_probs, teacher_log_probs, loss_mode, log_prob_min_clamp, loss_max_clamp)
    adv = -float(coef) * divergence.detach()
    if task_advantages is not None:
        adv = adv + task_advantages
    return adv * response_mask


def distillation_metrics(student_log_probs: torch.Tensor, teacher_log_probs: torch.Tensor,
                         response_mask: torch.Tensor) -> dict[str, float]:
    """Teacher-student divergence on the student's samples: the k1 and k3 estimates of KL(student || teacher)
    (token means over the response mask) and the fraction of tokens the teacher finds likelier than the
    student.

    Args:
        student_log_probs / teacher_log_probs: (B, R) log-probs of the sampled tokens.
        response_mask: (B, R).
    """
    mask = response_mask.bool()
    n = max(int(mask.sum()), 1)
    diff = (student_log_probs - teacher_log_probs)[mask]
    k3 = kl_penalty(student_log_probs, teacher_log_probs, "k3")[mask]
    return {
        "distillation/teacher_student_kl": float(diff.sum()) / n,
        "distillation/teacher_student_kl_k3": float(k3.sum()) / n,
        "distillation/teacher_prefers_fraction": float((diff < 0).sum()) / n,
        "distillation/teacher_log_prob_mean": float(teacher_log_probs[mask].sum()) / n,
    }


def topk_overlap(student_topk_ids: torch.Tensor, teacher_topk_ids: torch.Tensor,
                 response_mask: torch.Tensor) -> float:
    """Mean over response tokens of |top-k(student) ∩ top-k(teacher)| / k.

    Args:
        student_topk_ids / teacher_topk_ids: (B, R, k) token ids of each model's k likeliest tokens.
        response_mask: (B, R).
    """
    if student_topk_ids.shape != teacher_topk_ids.shape:
        raise ValueError(f"top-k ids differ in shape: {tuple(student_topk_ids.shape)} vs "
                         f"{tuple(teacher_topk_ids.shape)}")
    k = student_topk_ids.shape[-1]
    shared = (student_topk_ids.unsqueeze(-1) == teacher_topk_ids.unsqueeze(-2)).any(dim=-1).sum(dim=-1)
    mask = response_mask.bool()
    return float(shared[mask].sum()) / (max(int(mask.sum()), 1) * k)


def mix_teacher_log_probs(log_probs: dict[str, torch.Tensor], rows: dict[str, torch.Tensor],
                          weights: dict[str, float]) -> torch.Tensor:
    """Each row's teacher log-probs from several teachers.

    Teachers given `rows` masks that split the batch (chosen by the row's `teacher_key`) give each row their own
    log-probs; teachers that all score every row are mixed: sum_i w_i log p_i / sum_i w_i (a weighted geometric
    mean of their distributions, evaluated at the sampled tokens).

    Args:
        log_probs: {teacher: (B, R) log-probs of the sampled tokens}.
        rows: {teacher: bool (B,) rows it scores}.
        weights: {teacher: weight > 0}, read when every teacher scores every row.

    Returns:
        (B, R) target log-probs.
    """
    names = list(log_probs)
    if all(bool(rows[n].all()) for n in names):
        total = sum(float(weights[n]) for n in names)
        return sum(float(weights[n]) / total * log_probs[n] for n in names)
    out = torch.zeros_like(log_probs[names[0]])
    for n in names:
        out = torch.where(rows[n].to(out.device)[:, None], log_probs[n], out)
    return out
