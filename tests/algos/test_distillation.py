"""Distillation losses against hand-computed values (natural logs of simple probabilities)."""

import math

import pytest
import torch

from rlpost.algos.distillation import (distillation_advantages, distillation_loss, distillation_metrics,
                                       estimator_divergence, is_topk_mode, mask_duplicate_ids, merge_topk,
                                       mix_teacher_log_probs, topk_divergence,
                                       topk_overlap)

LN2 = math.log(2.0)


def _lp(*probs):
    return torch.tensor([[math.log(p) for p in probs]])


def test_estimators_on_sampled_tokens():
    # student p=0.5, teacher p=0.25 on token 1; student 0.25, teacher 0.5 on token 2
    s, t = _lp(0.5, 0.25), _lp(0.25, 0.5)
    k1 = estimator_divergence(s, t, "k1")
    assert torch.allclose(k1, torch.tensor([[LN2, -LN2]]))
    # k2 = 0.5 d^2
    assert torch.allclose(estimator_divergence(s, t, "k2"), torch.tensor([[0.5 * LN2**2, 0.5 * LN2**2]]))
    assert torch.allclose(estimator_divergence(s, t, "abs"), torch.tensor([[LN2, LN2]]))
    # k3 = r - log r - 1, r = p_t / p_s: token 1 r = 1/2 -> 0.5 + ln2 - 1; token 2 r = 2 -> 2 - ln2 - 1
    assert torch.allclose(estimator_divergence(s, t, "k3"), torch.tensor([[LN2 - 0.5, 1.0 - LN2]]))


def test_clamps():
    s, t = _lp(0.5), torch.tensor([[-30.0]])
    # floor: the teacher's -30 becomes -5 -> k1 = ln(0.5) + 5
    assert torch.allclose(estimator_divergence(s, t, "k1", log_prob_min_clamp=-5.0),
                          torch.tensor([[5.0 - LN2]]))
    # ceiling on the per-token value
    assert torch.allclose(estimator_divergence(s, t, "k1", loss_max_clamp=10.0), torch.tensor([[10.0]]))


def test_loss_is_token_mean_over_the_mask_and_has_the_student_gradient():
    s = _lp(0.5, 0.25, 0.9).requires_grad_(True)
    t = _lp(0.25, 0.5, 0.1)
    mask = torch.tensor([[1.0, 1.0, 0.0]])  # the third token is padding
    loss = distillation_loss(s, t, mask, "k1")
    assert loss.item() == pytest.approx(0.0, abs=1e-6)  # (ln2 - ln2) / 2
    loss.backward()
    # d/ds of mean(s - t) over 2 tokens = 1/2 on each valid token, 0 on padding
    assert torch.allclose(s.grad, torch.tensor([[0.5, 0.5, 0.0]]))


def test_topk_forward_reverse_and_jsd():
    # k = 2 tokens; teacher (0.5, 0.5), student (0.25, 0.75)
    t = torch.log(torch.tensor([[[0.5, 0.5]]]))
    s = torch.log(torch.tensor([[[0.25, 0.75]]]))
    fwd = 0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75)
    rev = 0.25 * math.log(0.25 / 0.5) + 0.75 * math.log(0.75 / 0.5)
    assert topk_divergence(s, t, "forward_kl_topk").item() == pytest.approx(fwd, rel=1e-5)
    assert topk_divergence(s, t, "reverse_kl_topk").item() == pytest.approx(rev, rel=1e-5)
    # beta = 0.5: m = (0.375, 0.625)
    m = (0.375, 0.625)
    kl_tm = 0.5 * math.log(0.5 / m[0]) + 0.5 * math.log(0.5 / m[1])
    kl_sm = 0.25 * math.log(0.25 / m[0]) + 0.75 * math.log(0.75 / m[1])
    assert topk_divergence(s, t, "jsd_topk").item() == pytest.approx(0.5 * kl_tm + 0.5 * kl_sm, rel=1e-5)
    # beta = 1 leaves KL(teacher || teacher) = 0 from the first term and nothing from the second
    assert topk_divergence(s, t, "jsd_topk", jsd_beta=1.0).item() == pytest.approx(0.0, abs=1e-6)


def test_topk_truncated_mass_is_clamped_at_zero_and_minus_inf_stays_finite():
    # teacher puts 0.1 on the shared token and 0 (-inf) on the other; student 0.5 / 0.4 on them
    t = torch.tensor([[[math.log(0.1), float("-inf")]]])
    s = torch.log(torch.tensor([[[0.5, 0.4]]]))
    fwd = topk_divergence(s, t, "forward_kl_topk")
    # 0.1 ln(0.1/0.5) + 1e-8 ln(1e-8 / 0.4) < 0 -> clamped to 0
    assert fwd.item() == 0.0
    rev = topk_divergence(s, t, "reverse_kl_topk")
    want = 0.5 * math.log(0.5 / 0.1) + 0.4 * (math.log(0.4) - math.log(1e-8))
    assert rev.item() == pytest.approx(want, rel=1e-5)
    assert topk_divergence(s, t, "reverse_kl_topk", loss_max_clamp=1.0).item() == pytest.approx(1.0)


def test_full_vocabulary_is_topk_with_k_equal_v():
    logits_t, logits_s = torch.tensor([[[1.0, 0.0, -1.0]]]), torch.tensor([[[0.0, 0.5, 0.0]]])
    lt, ls = logits_t.log_softmax(-1), logits_s.log_softmax(-1)
    exact = (ls.exp() * (ls - lt)).sum(-1)
    assert torch.allclose(topk_divergence(ls, lt, "reverse_kl_topk"), exact)


def test_policy_gradient_advantages():
    old, t = _lp(0.5, 0.25), _lp(0.25, 0.5)
    mask = torch.tensor([[1.0, 1.0]])
    adv = distillation_advantages(old, t, mask, "k1", coef=2.0)
    # -(log p_s - log p_t) x 2: -2 ln2 where the teacher likes the token less, +2 ln2 where more
    assert torch.allclose(adv, torch.tensor([[-2 * LN2, 2 * LN2]]))
    task = torch.tensor([[1.0, 1.0]])
    both = distillation_advantages(old, t, torch.tensor([[1.0, 0.0]]), "k1", task_advantages=task)
    assert torch.allclose(both, torch.tensor([[1.0 - LN2, 0.0]]))


def test_metrics_and_overlap():
    s, t = _lp(0.5, 0.25, 0.5), _lp(0.25, 0.5, 0.5)
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    m = distillation_metrics(s, t, mask)
    assert m["distillation/teacher_student_kl"] == pytest.approx(0.0, abs=1e-6)
    assert m["distillation/teacher_student_kl_k3"] == pytest.approx(((LN2 - 0.5) + (1 - LN2)) / 2, rel=1e-5)
    assert m["distillation/teacher_prefers_fraction"] == 0.5
    st = torch.tensor([[[1, 2], [3, 4]]])
    te = torch.tensor([[[2, 1], [5, 3]]])
    # position 1 shares both ids, position 2 one of two; the mask keeps both -> (2 + 1) / 4
    assert topk_overlap(st, te, torch.ones(1, 2)) == 0.75
    assert topk_overlap(st, te, torch.tensor([[0.0, 1.0]])) == 0.5


def test_modes_and_errors():
    assert is_topk_mode("jsd_topk") and not is_topk_mode("k3")
    with pytest.raises(ValueError, match="Unknown distillation loss mode 'k4'"):
        is_topk_mode("k4")
    with pytest.raises(ValueError, match="top-k"):
        estimator_divergence(_lp(0.5), _lp(0.5), "forward_kl_topk")


def test_teachers_by_row_or_mixed_by_weight():
    a, b = torch.tensor([[-1.0, -2.0], [-3.0, -4.0]]), torch.tensor([[-5.0, -6.0], [-7.0, -8.0]])
    split = {"a": torch.tensor([True, False]), "b": torch.tensor([False, True])}
    # each row its own teacher's values
    assert torch.equal(mix_teacher_log_probs({"a": a, "b": b}, split, {"a": 1.0, "b": 1.0}),
                       torch.tensor([[-1.0, -2.0], [-7.0, -8.0]]))
    # every teacher on every row: weights 3 and 1 -> 0.75 a + 0.25 b
    every = {"a": torch.tensor([True, True]), "b": torch.tensor([True, True])}
    assert torch.allclose(mix_teacher_log_probs({"a": a, "b": b}, every, {"a": 3.0, "b": 1.0}),
                          torch.tensor([[-2.0, -3.0], [-4.0, -5.0]]))


@pytest.mark.timeout(30)
def test_merge_topk_is_the_sorted_union_with_a_shared_id_counted_once():
    # student's top-2 ids (7, 3), teacher's own top-2 (3, 9); teacher probs: id 7 -> 0.1, 3 -> 0.6, 9 -> 0.2
    student_ids = torch.tensor([[[7, 3]]])
    at_student = torch.log(torch.tensor([[[0.1, 0.6]]]))
    own_ids, own = torch.tensor([[[3, 9]]]), torch.log(torch.tensor([[[0.6, 0.2]]]))
    log_probs, ids = merge_topk(at_student, student_ids, own, own_ids)
    assert ids.tolist() == [[[3, 3, 7, 9]]]
    # the first 3 is the duplicate: -inf; the rest keep the teacher's log-probs of their ids
    assert log_probs[0, 0, 0].item() == float("-inf")
    assert torch.allclose(log_probs[0, 0, 1:].exp(), torch.tensor([0.6, 0.1, 0.2]))
    # the student's log-probs of the same ids, masked the same way: the divergence counts id 3 once
    student = mask_duplicate_ids(torch.log(torch.tensor([[[0.5, 0.5, 0.3, 0.1]]])), ids)
    fwd = topk_divergence(student, log_probs, "forward_kl_topk").item()
    want = 0.6 * math.log(0.6 / 0.5) + 0.1 * math.log(0.1 / 0.3) + 0.2 * math.log(0.2 / 0.1)
    assert fwd == pytest.approx(want, rel=1e-5)  # the duplicate pair adds 1e-8 * 0


@pytest.mark.timeout(30)
def test_topk_loss_over_the_mask_has_gradient_on_every_support_entry():
    s = torch.log(torch.tensor([[[0.25, 0.75], [0.5, 0.5]]])).requires_grad_(True)
    t = torch.log(torch.tensor([[[0.5, 0.5], [0.9, 0.1]]]))
    loss = distillation_loss(s, t, torch.tensor([[1.0, 0.0]]), "forward_kl_topk")
    fwd = 0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75)
    assert loss.item() == pytest.approx(fwd, rel=1e-5)  # the masked position does not count
    loss.backward()
    # d/d log s_i of sum_i t_i (log t_i - log s_i) = -t_i at the kept position, 0 at the masked one
    assert torch.allclose(s.grad, torch.tensor([[[-0.5, -0.5], [0.0, 0.0]]]))
