"""clip_cov, kl_cov, geo_mean, cispo, sapo and topr policy losses against hand-computed examples."""

import math
from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf

from rlpost import algos as ca


def _close(actual, expected, atol=1e-5):
    # torch.allclose rather than torch.testing.assert_close: the latter costs seconds on first use
    expected = torch.as_tensor(expected, dtype=actual.dtype)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert torch.allclose(actual, expected, atol=atol, rtol=0), (actual, expected)


def _cfg(**policy_loss):
    """Actor config with verl's defaults; `policy_loss` entries override."""
    pl = dict(loss_mode="vanilla", clip_cov_ratio=0.0002, clip_cov_lb=1.0, clip_cov_ub=5.0, kl_cov_ratio=0.0002,
              ppo_kl_coef=0.1)
    pl.update(policy_loss)
    return SimpleNamespace(clip_ratio=0.2, clip_ratio_low=None, clip_ratio_high=None, clip_ratio_c=3.0,
                           tau_pos=1.0, tau_neg=1.05, policy_loss=SimpleNamespace(**pl))


def test_new_losses_are_registered_under_verl_names():
    for name in ("clip_cov", "kl_cov", "geo_mean", "cispo", "sapo", "topr"):
        assert name in ca.POLICY_LOSSES


# Shared by clip_cov / kl_cov: one row, ratios r = [1.1, 1.5, 0.9, 1.0], A = [1, 1, -1, 0], clip 0.2.
RATIOS = [1.1, 1.5, 0.9, 1.0]
ADV = [1.0, 1.0, -1.0, 0.0]


def _cov_by_hand():
    """Centred covariance per token, (A - mean A) * (log r - mean log r), spelled out."""
    logs = [math.log(r) for r in RATIOS]
    mean_a, mean_l = sum(ADV) / 4, sum(logs) / 4
    return [(a - mean_a) * (lg - mean_l) for a, lg in zip(ADV, logs)]


def _cov_inputs():
    log_prob = torch.tensor([[math.log(r) for r in RATIOS]], requires_grad=True)
    return torch.zeros(1, 4), log_prob, torch.tensor([ADV]), torch.ones(1, 4)


def test_clip_cov_cuts_the_unclipped_high_covariance_token():
    cov = _cov_by_hand()  # ~[-0.0027, 0.2300, 0.2553, 0.0247]
    assert 0.1 < cov[2] < 0.3 and cov[1] > 0.1 and max(cov[0], cov[3]) < 0.1
    old, log_prob, adv, mask = _cov_inputs()
    # lb 0.1: token 1 is PPO-clipped (excluded), token 2 is the only candidate and is cut (n_cut = 1).
    # Losses: max(-1.1, -1.1) = -1.1; max(-1.5, -1.2) = -1.2; cut -> 0; A = 0 -> 0.
    loss, clipfrac, ppo_kl, lower = ca.get_policy_loss_fn("clip_cov")(
        old, log_prob, adv, mask, "token-mean", _cfg(clip_cov_lb=0.1))
    _close(loss, (-1.1 - 1.2) / 4)
    _close(clipfrac, 1 / 4)
    _close(ppo_kl, -sum(math.log(r) for r in RATIOS) / 4)
    _close(lower, 0.0)
    loss.backward()
    _close(log_prob.grad, [[-1.1 / 4, 0.0, 0.0, 0.0]])  # token 0 only: d(-A r)/d log r = -A r
    # lb 0.3 leaves no candidate: plain PPO clip, (-1.1 - 1.2 + 0.9 + 0) / 4
    loss, clipfrac, _, _ = ca.compute_policy_loss_clip_cov(*_cov_inputs(), "token-mean", _cfg(clip_cov_lb=0.3))
    _close(loss, (-1.1 - 1.2 + 0.9) / 4)
    _close(clipfrac, 0.0)


def test_clip_cov_cuts_at_most_ratio_times_tokens():
    # lb -1: tokens 0, 2, 3 are candidates; ratio 0.5 -> int(0.5 * 4) = 2 of them are cut at random
    _, clipfrac, _, _ = ca.compute_policy_loss_clip_cov(
        *_cov_inputs(), "token-mean", _cfg(clip_cov_lb=-1.0, clip_cov_ratio=0.5))
    _close(clipfrac, 2 / 4)
    with pytest.raises(ValueError, match="clip_cov_ratio=0.0 is invalid"):
        ca.compute_policy_loss_clip_cov(*_cov_inputs(), "token-mean", _cfg(clip_cov_ratio=0.0))


def test_kl_cov_penalises_the_top_covariance_tokens():
    logs = [math.log(r) for r in RATIOS]
    old, log_prob, adv, mask = _cov_inputs()
    # ratio 0.25 -> k = 1: the largest covariance is token 2, which gets -A r + 0.1 * |log r|
    loss, clipfrac, ppo_kl, lower = ca.get_policy_loss_fn("kl_cov")(
        old, log_prob, adv, mask, "token-mean", _cfg(kl_cov_ratio=0.25))
    _close(loss, (-1.1 - 1.5 + (0.9 + 0.1 * abs(logs[2])) + 0.0) / 4)
    _close(ppo_kl, sum(abs(x) for x in logs) / 4)
    _close(clipfrac, 0.0)
    _close(lower, 0.0)
    loss.backward()
    # token 2: d(-A r + c |log r|)/d log r = -A r - c (log r < 0) = 0.9 - 0.1
    _close(log_prob.grad, [[-1.1 / 4, -1.5 / 4, (0.9 - 0.1) / 4, 0.0]])
    # ratio 0.5 -> k = 2: tokens 2 and 1 (covariance 0.255 and 0.230)
    loss, _, _, _ = ca.compute_policy_loss_kl_cov(*_cov_inputs(), "token-mean", _cfg(kl_cov_ratio=0.5, ppo_kl_coef=1.0))
    _close(loss, (-1.1 + (-1.5 + abs(logs[1])) + (0.9 + abs(logs[2]))) / 4)


def _geo_inputs():
    # row0: d = [0.1, 0.3], A = 1; row1: d = [-0.5, 0.1] (+ a masked 9.0), A = -1; row2: nothing valid.
    log_prob = torch.tensor([[0.1, 0.3, 0.0], [-0.5, 0.1, 9.0], [0.4, 0.4, 0.4]], requires_grad=True)
    adv = torch.tensor([[1.0, 1.0, 0.0], [-1.0, -1.0, -1.0], [1.0, 1.0, 1.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    return torch.zeros(3, 3), log_prob, adv, mask


def test_geo_mean_clips_in_log_space_per_sign():
    old, log_prob, adv, mask = _geo_inputs()
    # clip 0.2 in log space. A > 0: d' = min(d, clip(d)) -> [0.1, 0.2], rho = e^0.15, loss = -1 * e^0.15.
    # A < 0: d' = max(d, clip(d)) -> [-0.2, 0.1], rho = e^-0.05, loss = +1 * e^-0.05.
    # Mean over the 2 rows with a valid token (row2 is empty).
    loss, clipfrac, ppo_kl, lower = ca.get_policy_loss_fn("geo_mean")(old, log_prob, adv, mask, "token-mean", _cfg())
    _close(loss, (-math.exp(0.15) + math.exp(-0.05)) / 2)
    _close(clipfrac, 1 / 4)  # row0 token1 (A > 0) of 4 valid tokens
    _close(lower, 1 / 4)  # row1 token0 (A < 0)
    _close(ppo_kl, -(0.1 + 0.3 - 0.5 + 0.1) / 4)
    loss.backward()
    # unclipped tokens: d loss / d d_t = -a * rho / len / rows
    _close(log_prob.grad, [[-math.exp(0.15) / 2 / 2, 0.0, 0.0], [0.0, math.exp(-0.05) / 2 / 2, 0.0], [0.0] * 3])
    # IS weights enter as the row's geometric mean: row0 [4, 1] -> 2, row1 [1, 1] -> 1
    w = torch.tensor([[4.0, 1.0, 0.0], [1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    loss_w, _, _, _ = ca.compute_policy_loss_geo_mean(*_geo_inputs(), "token-mean", _cfg(), rollout_is_weights=w)
    _close(loss_w, (-2 * math.exp(0.15) + math.exp(-0.05)) / 2)


def test_cispo_clips_the_weight_but_keeps_every_gradient():
    ratios = [1.5, 0.5, 1.1]
    log_prob = torch.tensor([[math.log(r) for r in ratios]], requires_grad=True)
    adv = torch.tensor([[1.0, -1.0, 2.0]])
    # weights sg(clip(r, 0.8, 1.2)) = [1.2, 0.8, 1.1]; L_t = -w_t * A_t * log_prob_t
    loss, clipfrac, ppo_kl, lower = ca.get_policy_loss_fn("cispo")(
        torch.zeros(1, 3), log_prob, adv, torch.ones(1, 3), "token-mean", _cfg())
    _close(loss, (-1.2 * 1 * math.log(1.5) - 0.8 * -1 * math.log(0.5) - 1.1 * 2 * math.log(1.1)) / 3)
    _close(clipfrac, 2 / 3)
    _close(lower, 0.0)
    _close(ppo_kl, -sum(math.log(r) for r in ratios) / 3)
    loss.backward()
    _close(log_prob.grad, [[-1.2 / 3, 0.8 / 3, -2.2 / 3]])  # -w * A: clipped tokens still move
    w = torch.tensor([[2.0, 0.0, 0.0]])
    loss_w, _, _, _ = ca.compute_policy_loss_cispo(torch.zeros(1, 3), log_prob.detach(), adv, torch.ones(1, 3),
                                                   "token-mean", _cfg(), rollout_is_weights=w)
    _close(loss_w, -2 * 1.2 * math.log(1.5) / 3)


def test_sapo_soft_gate_by_hand():
    # r = [1, 2], A = [1, -1]; tau 1.0 (A > 0) and 1.05 (A <= 0).
    # token0: f = sigmoid(0) * 4 / 1 = 2 -> loss -2. token1: f = sigmoid(1.05) * 4 / 1.05 -> loss +f.
    s = 1 / (1 + math.exp(-1.05))
    f1 = s * 4 / 1.05
    cfg = OmegaConf.create({"clip_ratio": 0.2, "tau_pos": 1.0, "tau_neg": 1.05})  # a DictConfig works too
    log_prob = torch.tensor([[0.0, math.log(2.0)]], requires_grad=True)
    adv = torch.tensor([[1.0, -1.0]])
    loss, clipfrac, ppo_kl, lower = ca.get_policy_loss_fn("sapo")(
        torch.zeros(1, 2), log_prob, adv, torch.ones(1, 2), "seq-mean-token-mean", cfg)
    _close(loss, (-2.0 + f1) / 2)
    _close(clipfrac, 0.0)
    _close(lower, 0.0)
    _close(ppo_kl, -math.log(2.0) / 2)
    loss.backward()
    # d f / d r = 4 s (1 - s) (slope 1 at r = 1); d r / d log r = r; d L / d f = -A
    _close(log_prob.grad, [[-1.0 * 1.0 * 1.0 / 2, 1.0 * 4 * s * (1 - s) * 2.0 / 2]])
    with pytest.raises(ValueError, match="tau_neg=0.0 are invalid"):
        ca.compute_policy_loss_sapo(torch.zeros(1, 2), log_prob, adv, torch.ones(1, 2), config=OmegaConf.create(
            {"tau_pos": 1.0, "tau_neg": 0.0}))
    with pytest.raises(ValueError, match="no key 'tau_pos'"):
        ca.compute_policy_loss_sapo(torch.zeros(1, 2), log_prob, adv, torch.ones(1, 2), config={"tau_neg": 1.0})


def test_losses_that_need_a_config_say_so():
    z = torch.zeros(1, 2)
    for name in ("clip_cov", "kl_cov", "geo_mean", "cispo", "sapo", "topr"):
        with pytest.raises(ValueError, match="config"):
            ca.get_policy_loss_fn(name)(z, z, z, z + 1)


def test_topr_tapers_only_negative_sequences_by_hand():
    # old log-probs 0, so each token's log-ratio is its log-prob. Rows (2 tokens each):
    #   row0 A=-1, log r = [ln 4, 0] -> s = exp(ln 4 / 2) = 2 -> w = clip(2, 0, 1) = 1 (tapered)
    #   row1 A=-1, log r = [ln 1/4, 0] -> s = 1/2 -> w = 1/2
    #   row2 A=+1, log r = [ln 1/2, ln 1/2] -> w = 1 (positive: no importance weight)
    # L_t = -w * A * log_prob_t; token-mean over 6: (ln 4 + 0.5 ln 1/4 - 2 ln 1/2) / 6 = ln 2 / 2
    log_prob = torch.tensor([[math.log(4), 0.0], [math.log(0.25), 0.0], [math.log(0.5), math.log(0.5)]],
                            requires_grad=True)
    adv = torch.tensor([[-1.0, -1.0], [-1.0, -1.0], [1.0, 1.0]])
    cfg = _cfg(topr_negative_ratio_lower=0.0, topr_negative_ratio_upper=1.0)
    loss, clipfrac, ppo_kl, lower = ca.get_policy_loss_fn("topr")(
        torch.zeros(3, 2), log_prob, adv, torch.ones(3, 2), "token-mean", cfg)
    _close(loss, math.log(2) / 2)
    _close(clipfrac, 2 / 6)  # row0's two tokens were tapered
    _close(ppo_kl, math.log(2) / 3)
    _close(lower, 0.0)
    loss.backward()
    _close(log_prob.grad, [[1 / 6, 1 / 6], [0.5 / 6, 0.5 / 6], [-1 / 6, -1 / 6]])  # -w * A / 6: weights detached
    # a narrower taper [0.6, 0.8]: row0 -> 0.8, row1 -> 0.6
    loss2, clipfrac2, _, _ = ca.compute_policy_loss_topr(
        torch.zeros(3, 2), log_prob.detach(), adv, torch.ones(3, 2), "token-mean",
        _cfg(topr_negative_ratio_lower=0.6, topr_negative_ratio_upper=0.8))
    _close(loss2, (0.8 * math.log(4) + 0.6 * math.log(0.25) - 2 * math.log(0.5)) / 6)
    _close(clipfrac2, 4 / 6)
    with pytest.raises(ValueError, match="topr_negative_ratio_lower=0.9, topr_negative_ratio_upper=0.5"):
        ca.compute_policy_loss_topr(torch.zeros(3, 2), log_prob, adv, torch.ones(3, 2), config=_cfg(
            topr_negative_ratio_lower=0.9, topr_negative_ratio_upper=0.5))
