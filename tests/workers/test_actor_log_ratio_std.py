"""The actor's `actor/log_ratio_std`: the spread over the response tokens of log pi_theta - log pi_old, the
importance ratio's spread in log space (0 when the old log-probs are the policy's own; the hand-set spread when they
are shifted token by token)."""

from __future__ import annotations

import pytest
import torch

from _batches import own_policy_actor
from rlpost import keys

pytestmark = pytest.mark.timeout(120)
VOCAB = 96


def test_own_log_probs_give_no_spread_and_a_hand_set_shift_gives_its_std():
    actor, batch, own = own_policy_actor(VOCAB)
    batch.update({keys.OLD_LOG_PROBS: own.clone(), keys.ADVANTAGES: torch.zeros_like(own)})
    assert float(actor._micro_loss(batch, 1.0)[1]["actor/log_ratio_std"]) == pytest.approx(0.0, abs=1e-6)
    mask = batch[keys.RESPONSE_MASK].bool()
    # old = own + s with s = +0.2 on the even response tokens and -0.2 on the odd ones of each row: the log ratio
    # is -s, whose mean over the masked tokens is m and whose population std is sqrt(0.04 - m^2)
    signs = torch.where(torch.arange(own.shape[1]) % 2 == 0, 1.0, -1.0).expand_as(own)
    batch[keys.OLD_LOG_PROBS] = own + 0.2 * signs
    _, metrics = actor._micro_loss(batch, 1.0)
    m = float((-0.2 * signs)[mask].mean())
    assert float(metrics["actor/log_ratio_std"]) == pytest.approx((0.04 - m * m) ** 0.5, rel=1e-4)
