"""Loss aggregation, policy losses and value loss against hand-computed examples."""

import math
from types import SimpleNamespace

import pytest
import torch

from rlpost import algos as ca


def _close(actual, expected, atol=1e-5):
    # torch.allclose rather than torch.testing.assert_close: the latter costs seconds on first use
    expected = torch.as_tensor(expected, dtype=actual.dtype)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert torch.allclose(actual, expected, atol=atol, rtol=0), (actual, expected)


LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])


@pytest.mark.parametrize(
    "mode,expected",
    [
        ("token-mean", (1 + 2 + 3 + 4) / 4),
        ("seq-mean-token-sum", (6 + 4) / 2),
        ("seq-mean-token-mean", (6 / 3 + 4 / 1) / 2),
        ("seq-mean-token-sum-norm", (6 / 3 + 4 / 3) / 2),
    ],
)
def test_agg_loss_modes(mode, expected):
    _close(ca.agg_loss(LOSS, MASK, mode), expected)
    # a row with no valid token (and garbage values) changes nothing
    loss = torch.cat([LOSS, torch.full((1, 3), float("nan"))])
    mask = torch.cat([MASK, torch.zeros(1, 3)])
    _close(ca.agg_loss(loss, mask, mode), expected)


def test_agg_loss_norm_length_and_unknown_mode():
    _close(ca.agg_loss(LOSS, MASK, "seq-mean-token-sum-norm", norm_length=10), (6 / 10 + 4 / 10) / 2)
    with pytest.raises(ValueError, match="Unknown loss_agg_mode 'token-summ'"):
        ca.agg_loss(LOSS, MASK, "token-summ")


def test_loss_agg_modes_registry_and_dr_grpo_norm_by_hand():
    assert ca.LOSS_AGG_MODES.names() == sorted(
        ["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
    # Dr.GRPO: row sums 1 + 2 = 3 (2 tokens) and 5 (1 token), divided by the same constant R = 4, then
    # averaged over the 2 rows: (3/4 + 5/4) / 2 = 1.0. A token mean per row would give (1.5 + 5) / 2.
    loss = torch.tensor([[1.0, 2.0, 0.0, 0.0], [5.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]])
    _close(ca.agg_loss(loss, mask, "seq-mean-token-sum-norm"), 1.0)
    _close(ca.agg_loss(loss, mask, "seq-mean-token-sum-norm", norm_length=2), (3 / 2 + 5 / 2) / 2)
    _close(ca.agg_loss(loss, mask, "seq-mean-token-mean"), (1.5 + 5.0) / 2)


def test_vanilla_ppo_clip_and_dual_clip():
    # clip 0.2, c = 3. Per token (A, ratio) -> loss:
    #  (1, 1.5): max(-1.5, -1.2) = -1.2 (clipped)      (1, 0.5): max(-0.5, -0.8) = -0.5
    #  (-1, 0.5): max(0.5, 0.8) = 0.8 (clipped) < 3     (-1, 5): max(5, 1.2) = 5 -> dual clip min(5, 3) = 3
    ratios = [1.5, 0.5, 0.5, 5.0]
    log_prob = torch.tensor([[math.log(r) for r in ratios]], requires_grad=True)
    old = torch.zeros(1, 4)
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0]])
    mask = torch.ones(1, 4)
    loss, clipfrac, ppo_kl, clipfrac_lower = ca.compute_policy_loss_vanilla(
        old, log_prob, adv, mask, "token-mean", clip_ratio=0.2, clip_ratio_c=3.0
    )
    _close(loss, (-1.2 - 0.5 + 0.8 + 3.0) / 4)
    _close(clipfrac, 2 / 4)
    _close(clipfrac_lower, 1 / 4)
    _close(ppo_kl, -sum(math.log(r) for r in ratios) / 4)
    loss.backward()
    # only token 1 is unclipped: d(-A * ratio)/d log_prob = -A * ratio = -0.5, over 4 tokens
    _close(log_prob.grad, [[0.0, -0.5 / 4, 0.0, 0.0]])


def test_vanilla_asymmetric_clip_from_config():
    # low falls back to clip_ratio 0.2, high 0.28: ratio 1.25 stays, ratio 1.3 clips to 1.28 (A = 1).
    cfg = SimpleNamespace(clip_ratio=0.2, clip_ratio_low=None, clip_ratio_high=0.28, clip_ratio_c=3.0)
    log_prob = torch.log(torch.tensor([[1.25, 1.3, 0.7]]))
    adv = torch.tensor([[1.0, 1.0, -1.0]])  # (-1, 0.7): max(0.7, 0.8) = 0.8, clipped at 1 - 0.2
    loss, clipfrac, _, _ = ca.get_policy_loss_fn("vanilla")(
        torch.zeros(1, 3), log_prob, adv, torch.ones(1, 3), loss_agg_mode="token-mean", config=cfg
    )
    _close(loss, (-1.25 - 1.28 + 0.8) / 3)
    _close(clipfrac, 2 / 3)
    # a plain dict config works the same; a key the loss reads must be present
    full = {"clip_ratio": 0.2, "clip_ratio_low": None, "clip_ratio_high": 0.28, "clip_ratio_c": 3.0}
    loss_dict, _, _, _ = ca.compute_policy_loss_vanilla(torch.zeros(1, 3), log_prob, adv, torch.ones(1, 3), config=full)
    _close(loss_dict, (-1.25 - 1.28 + 0.8) / 3)
    with pytest.raises(ValueError, match="no key 'clip_ratio_c'"):
        ca.compute_policy_loss_vanilla(torch.zeros(1, 3), log_prob, adv, torch.ones(1, 3),
                                       config={"clip_ratio": 0.2, "clip_ratio_low": None, "clip_ratio_high": 0.28})
    assert ca.compute_policy_loss is ca.compute_policy_loss_vanilla


def test_vanilla_bad_settings_raise():
    z = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="not both"):
        ca.compute_policy_loss_vanilla(z, z, z, z + 1, config=SimpleNamespace(clip_ratio=0.2), clip_ratio=0.3)
    with pytest.raises(ValueError, match="clip_ratio_c=1.0 is invalid"):
        ca.compute_policy_loss_vanilla(z, z, z, z + 1, clip_ratio_c=1.0)
    with pytest.raises(ValueError, match="Did you mean 'gspo'"):
        ca.get_policy_loss_fn("gpso")


def _gspo_inputs():
    # row0: token ratios 1.2 and 1.0 -> s = sqrt(1.2); row1: ratio 0.9 on its only valid token
    # (the masked token's ratio 5 must not count) -> s = 0.9. A = 1 everywhere.
    log_prob = torch.log(torch.tensor([[1.2, 1.0], [0.9, 5.0]])).requires_grad_(True)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    return torch.zeros(2, 2), log_prob, torch.ones(2, 2), mask


def test_gspo_paper_clip():
    old, log_prob, adv, mask = _gspo_inputs()
    loss, clipfrac, _, lower = ca.compute_policy_loss_gspo(old, log_prob, adv, mask)
    # default clip (3e-4, 4e-4): row0 clipped to 1.0004 -> -1.0004 per token; row1: max(-0.9, -0.9997) = -0.9
    _close(loss, (-1.0004 + -0.9) / 2)
    _close(clipfrac, 2 / 3)
    _close(lower, 0.0)
    loss.backward()
    # row1 token0 is unclipped: d/dlogp = -A * s = -0.9, weighted 1/(1 token) * 1/(2 rows)
    _close(log_prob.grad, [[0.0, 0.0], [-0.45, 0.0]])


def test_gspo_with_config_clip():
    old, log_prob, adv, mask = _gspo_inputs()
    cfg = SimpleNamespace(clip_ratio=0.2, clip_ratio_low=None, clip_ratio_high=None)
    loss, clipfrac, _, _ = ca.get_policy_loss_fn("gspo")(old, log_prob, adv, mask, "seq-mean-token-mean", cfg)
    _close(loss, (-math.sqrt(1.2) - 0.9) / 2)
    _close(clipfrac, 0.0)


def test_rollout_is_weights_scale_token_losses_before_aggregation():
    # vanilla at ratio 1 (no clip): token losses -A = [-1, -2]; weights [0.5, 2] -> (-0.5 - 4) / 2
    old = torch.zeros(1, 2)
    log_prob = torch.zeros(1, 2, requires_grad=True)
    adv = torch.tensor([[1.0, 2.0]])
    w = torch.tensor([[0.5, 2.0]])
    loss, _, _, _ = ca.compute_policy_loss_vanilla(old, log_prob, adv, torch.ones(1, 2), rollout_is_weights=w)
    _close(loss, (-0.5 - 4.0) / 2)
    loss.backward()
    _close(log_prob.grad, [[-0.5 * 1 / 2, -2.0 * 2 / 2]])  # d(-w A r)/d log_prob = -w A at r = 1
    # gpg: -A * log_prob * w with log_prob = [-1, -1] -> (0.5 + 4) / 2
    loss_gpg, _, _, _ = ca.compute_policy_loss_gpg(old, torch.full((1, 2), -1.0), adv, torch.ones(1, 2),
                                                   rollout_is_weights=w)
    _close(loss_gpg, (0.5 + 4.0) / 2)
    # gspo, one row of 2 tokens at s = 1 with seq-mean-token-mean: (-0.5 - 4) / 2
    loss_gspo, _, _, _ = ca.compute_policy_loss_gspo(old, torch.zeros(1, 2), adv, torch.ones(1, 2),
                                                     rollout_is_weights=w)
    _close(loss_gspo, (-0.5 - 4.0) / 2)


def test_gpg_policy_loss():
    log_prob = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    adv = torch.tensor([[1.0, -1.0]])
    old = torch.tensor([[-1.5, -2.0]])
    loss, clipfrac, ppo_kl, _ = ca.compute_policy_loss_gpg(old, log_prob, adv, torch.ones(1, 2))
    _close(loss, (-(1.0 * -1.0) - (-1.0 * -2.0)) / 2)  # (1 - 2) / 2
    _close(ppo_kl, ((-1.5 + 1.0) + 0.0) / 2)
    _close(clipfrac, 0.0)
    loss.backward()
    _close(log_prob.grad, [[-0.5, 0.5]])


def test_value_loss():
    # values 0.5, clip 0.2 -> clipped range [0.3, 0.7]; returns 1.
    # vpred 1: max(0, (0.7-1)^2 = 0.09) = 0.09 (clipped); vpred 2: max(1, 0.09) = 1; vpred 0: max(1, 0.49) = 1
    vpreds = torch.tensor([[1.0, 2.0, 0.0]])
    returns = torch.ones(1, 3)
    values = torch.full((1, 3), 0.5)
    vf_loss, clipfrac = ca.compute_value_loss(vpreds, returns, values, torch.ones(1, 3), 0.2, "token-mean")
    _close(vf_loss, 0.5 * (0.09 + 1.0 + 1.0) / 3)
    _close(clipfrac, 1 / 3)
    vf_loss, clipfrac = ca.compute_value_loss(vpreds, returns, values, torch.tensor([[1.0, 0.0, 1.0]]), 0.2)
    _close(vf_loss, 0.5 * (0.09 + 1.0) / 2)
    _close(clipfrac, 1 / 2)
