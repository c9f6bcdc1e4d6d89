"""The actor's estimator distillation term (`distillation.distillation_loss.use_policy_gradient=false`, loss_mode k3,
the `distillation` meta_info of `update_policy`): coef x token-mean k3 added to the policy loss, 0 against a frozen
copy of the policy (self-distillation at step 1), the hand-derived value against a shifted teacher, and a gradient
that moves the student towards the teacher."""

from __future__ import annotations

import math

import pytest
import torch

from _batches import own_policy_actor
from rlpost import keys

pytestmark = pytest.mark.timeout(120)
VOCAB = 96
COEF = 0.5
K3 = {"loss_mode": "k3", "coef": COEF, "loss_max_clamp": None, "log_prob_min_clamp": None}


def _actor_and_batch():
    actor, batch, own = own_policy_actor(VOCAB)
    cfg = actor.config
    assert cfg.entropy_coeff == 0 and not cfg.use_kl_loss and cfg.loss_agg_mode == "token-mean"
    batch.update({keys.OLD_LOG_PROBS: own, keys.ADVANTAGES: torch.zeros_like(own)})  # zero advantages: pg loss 0
    actor._distill = dict(K3)  # what update_policy reads from meta_info["distillation"]
    return actor, batch, own


def test_a_frozen_copy_of_the_policy_adds_nothing():
    actor, batch, own = _actor_and_batch()
    batch[keys.TEACHER_LOG_PROBS] = own.clone()
    loss, metrics = actor._micro_loss(batch, 1.0)
    assert float(metrics["actor/distillation_loss"]) == pytest.approx(0.0, abs=1e-6)
    torch.testing.assert_close(loss, metrics["actor/pg_loss"], atol=1e-6, rtol=0)


def test_a_shifted_teacher_gives_the_hand_derived_k3_and_pulls_the_student_towards_it():
    actor, batch, own = _actor_and_batch()
    shift = 0.3  # the teacher finds every sampled token exp(0.3) times less likely than the student
    batch[keys.TEACHER_LOG_PROBS] = own - shift
    loss, metrics = actor._micro_loss(batch, 1.0)
    # r = p_t / p_s = exp(-0.3) on every token, k3 = r - log r - 1, and its token mean is the same number
    want = math.exp(-shift) + shift - 1
    assert float(metrics["actor/distillation_loss"]) == pytest.approx(want, rel=1e-5)
    torch.testing.assert_close(loss, metrics["actor/pg_loss"] + COEF * metrics["actor/distillation_loss"],
                               atol=1e-6, rtol=1e-6)
    # d k3 / d log p_s = 1 - r > 0: descending the loss lowers the student's log-probs of its samples
    loss.backward()
    with torch.no_grad():
        for p in actor.module.parameters():
            if p.grad is not None:
                p -= 1.0 * p.grad
        after = actor._forward_micro_batch(batch, 1.0, calculate_entropy=False)[1]
    mask = batch[keys.RESPONSE_MASK].bool()
    assert float(after[mask].mean()) < float(own[mask].mean())
