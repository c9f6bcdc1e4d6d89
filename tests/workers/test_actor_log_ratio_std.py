"""The actor's `actor/log_ratio_std`: per mini-batch, the spread over its response tokens of log pi_theta -
log pi_old (the importance ratio's spread in log space). Each micro-batch logs the two token moments, which the
mini-batch's share weights combine; 0 for the policy's own log-probs, the hand-set spread of a shift, and the
population std of all tokens at once when the mini-batch is split into micro-batches."""

from __future__ import annotations

import pytest
import torch

from _batches import own_policy_actor
from rlpost import keys
from rlpost.workers.actor import with_log_ratio_std

pytestmark = pytest.mark.timeout(120)
VOCAB = 96


def _std(actor, batch) -> float:
    _, m = actor._micro_loss(batch, 1.0)
    return with_log_ratio_std({k: [float(v)] for k, v in m.items() if k.startswith("actor/_log_ratio")})[
        "actor/log_ratio_std"][0]


def test_own_log_probs_give_no_spread_and_a_hand_set_shift_gives_its_std():
    actor, batch, own = own_policy_actor(VOCAB)
    batch.update({keys.OLD_LOG_PROBS: own.clone(), keys.ADVANTAGES: torch.zeros_like(own)})
    assert _std(actor, batch) == pytest.approx(0.0, abs=1e-6)
    mask = batch[keys.RESPONSE_MASK].bool()
    # old = own + s with s = +0.2 on the even response tokens and -0.2 on the odd ones of each row: the log ratio
    # is -s, whose mean over the masked tokens is m and whose population std is sqrt(0.04 - m^2)
    signs = torch.where(torch.arange(own.shape[1]) % 2 == 0, 1.0, -1.0).expand_as(own)
    batch[keys.OLD_LOG_PROBS] = own + 0.2 * signs
    m = float((-0.2 * signs)[mask].mean())
    assert _std(actor, batch) == pytest.approx((0.04 - m * m) ** 0.5, rel=1e-4)


def test_micro_batch_moments_weighted_by_their_token_share_give_the_whole_std():
    actor, batch, own = own_policy_actor(VOCAB)
    g = torch.Generator().manual_seed(1)
    batch.update({keys.OLD_LOG_PROBS: own + torch.randn(own.shape, generator=g), keys.ADVANTAGES: torch.zeros_like(own)})
    mask = batch[keys.RESPONSE_MASK].bool()
    whole = float((own - batch[keys.OLD_LOG_PROBS])[mask].std(unbiased=False))
    sums: dict[str, float] = {}
    for rows in (slice(0, 2), slice(2, 5)):  # two micro-batches of one mini-batch, weighted as train_epochs does
        micro = {k: v[rows] for k, v in batch.items()}
        share = float(micro[keys.RESPONSE_MASK].sum() / batch[keys.RESPONSE_MASK].sum())
        for k, v in actor._micro_loss(micro, 1.0)[1].items():
            if k.startswith("actor/_log_ratio"):
                sums[k] = sums.get(k, 0.0) + float(v) * share
    got = with_log_ratio_std({k: [v] for k, v in sums.items()})
    assert got["actor/log_ratio_std"][0] == pytest.approx(whole, rel=1e-4) and set(got) == {"actor/log_ratio_std"}
