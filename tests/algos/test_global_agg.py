"""verl's global-batch arguments of `agg_loss` / `compute_value_loss`, the token-sum mode and the DRO loss."""

from types import SimpleNamespace

import pytest
import torch

from rlpost import algos as ca

LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])  # row sums 6, 4; valid tokens 3, 1
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])


def _close(actual, expected, atol=1e-6):
    assert torch.allclose(actual, torch.as_tensor(expected, dtype=actual.dtype), atol=atol, rtol=0), (actual, expected)


@pytest.mark.parametrize("mode, kwargs, expected", [
    ("token-sum", {}, 10.0),
    ("token-sum", {"dp_size": 2}, 20.0),
    ("token-mean", {"dp_size": 2, "batch_num_tokens": 8}, 10 / 8 * 2),
    ("token-mean", {"dp_size": 2}, 10 / 4 * 2),  # no global count: this micro-batch's own 4 tokens
    ("seq-mean-token-sum", {"dp_size": 2, "global_batch_size": 4}, (6 + 4) / 4 * 2),
    ("seq-mean-token-mean", {"dp_size": 2, "global_batch_size": 4}, (6 / 3 + 4 / 1) / 4 * 2),
    ("seq-mean-token-sum-norm", {"dp_size": 2, "global_batch_size": 4, "loss_scale_factor": 10},
     (6 / 10 + 4 / 10) / 4 * 2),
    ("seq-mean-token-sum-norm", {"loss_scale_factor": 10}, (6 / 10 + 4 / 10) / 2),
])
def test_agg_loss_global_normalisation(mode, kwargs, expected):
    _close(ca.agg_loss(LOSS, MASK, mode, **kwargs), expected)


@pytest.mark.parametrize("mode, count_key", [("token-mean", "batch_num_tokens"), ("seq-mean-token-mean", "global_batch_size"),
                                             ("seq-mean-token-sum", "global_batch_size")])
def test_two_ranks_with_global_counts_average_to_the_whole_batch(mode, count_key):
    # the rows split over two data-parallel ranks; their losses averaged (as DP averages gradients) give the
    # loss of the whole batch computed in one place
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0], [5.0, 7.0, 0.0], [2.0, 2.0, 2.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    whole = ca.agg_loss(loss, mask, mode)
    count = {"batch_num_tokens": int(mask.sum()), "global_batch_size": 3}[count_key]
    parts = [ca.agg_loss(loss[i:i + 2], mask[i:i + 2], mode, dp_size=2, **{count_key: count}) for i in (0, 2)]
    _close((parts[0] + parts[1]) / 2, whole)


def test_agg_loss_rejects_two_divisors_and_a_bad_dp_size():
    with pytest.raises(ValueError, match="one divisor"):
        ca.agg_loss(LOSS, MASK, "seq-mean-token-sum-norm", loss_scale_factor=10, norm_length=5)
    with pytest.raises(ValueError, match="dp_size must be >= 1"):
        ca.agg_loss(LOSS, MASK, "token-mean", dp_size=0)
    with pytest.raises(ValueError, match="Valid names"):
        ca.agg_loss(LOSS, MASK, "token-meen", dp_size=2)


def test_value_loss_takes_the_global_arguments():
    vpreds, values = torch.tensor([[1.0, 2.0]]), torch.tensor([[1.0, 2.0]])  # inside the clip range
    returns = torch.zeros(1, 2)  # squared errors 1 and 4
    vf_loss, clipfrac = ca.compute_value_loss(vpreds, returns, values, torch.ones(1, 2), 0.2, "token-mean",
                                              dp_size=2, batch_num_tokens=4)
    _close(vf_loss, 0.5 * (1 + 4) / 4 * 2)
    _close(clipfrac, 0.0)
    vf_sum, _ = ca.compute_value_loss(vpreds, returns, values, torch.ones(1, 2), 0.2, "token-sum")
    _close(vf_sum, 0.5 * 5)


def test_dro_loss_value_gradient_and_kl():
    old = torch.zeros(1, 2)
    logp = torch.tensor([[-1.0, -0.5]], requires_grad=True)
    adv = torch.tensor([[2.0, -1.0]])
    config = SimpleNamespace(policy_loss=SimpleNamespace(dro_beta=0.5))
    loss, clipfrac, kl, lower = ca.compute_policy_loss_dro(old, logp, adv, torch.ones(1, 2), "token-mean", config)
    # -(A*logp - beta/2*(logp-old)^2): 2.25 and -0.4375
    _close(loss, (2.25 - 0.4375) / 2)
    _close(kl, 0.75)
    assert float(clipfrac) == 0.0 and float(lower) == 0.0
    loss.backward()
    # d/dlogp = -(A - beta*(logp-old)) / 2 tokens
    _close(logp.grad, [[-(2 + 0.5) / 2, -(-1 + 0.25) / 2]])
    assert ca.get_policy_loss_fn("dro") is ca.compute_policy_loss_dro


def test_dro_needs_its_beta():
    config = SimpleNamespace(policy_loss=SimpleNamespace(dro_beta=None))
    with pytest.raises(ValueError, match="dro_beta=0.05"):
        ca.compute_policy_loss_dro(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), torch.ones(1, 1),
                                   "token-mean", config)
