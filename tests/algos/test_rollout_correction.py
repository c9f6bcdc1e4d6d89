"""Rollout correction: importance weights, truncation, normalisation and rejection, by hand."""

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


def _cfg(**over):
    cfg = dict(rollout_is="token", rollout_is_threshold=2.0, rollout_is_batch_normalize=False, rollout_rs=None,
               rollout_rs_threshold=None, bypass_mode=False, loss_type="ppo_clip")
    cfg.update(over)
    return SimpleNamespace(**cfg)


# Ratios pi_old / pi_rollout: row0 [0.4, 1.5, 3.0] (product 1.8), row1 [1.2, 0.8] (product 0.96) + a pad
# position holding garbage.
RATIOS = [[0.4, 1.5, 3.0], [1.2, 0.8, 1.0]]
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])


def _run(**over):
    old = torch.log(torch.tensor(RATIOS))
    old[1, 2] = 99.0  # padding garbage must not count anywhere
    rollout = torch.zeros(2, 3)
    return ca.compute_rollout_correction(old, rollout, MASK, _cfg(**over))


def test_token_is_truncates_each_token():
    w, mask, m = _run()
    _close(w, [[0.4, 1.5, 2.0], [1.2, 0.8, 0.0]])
    _close(mask, MASK)
    assert m["rollout_corr/is_weight_mean"] == pytest.approx((0.4 + 1.5 + 2.0 + 1.2 + 0.8) / 5)
    assert m["rollout_corr/is_weight_max"] == pytest.approx(2.0)
    assert m["rollout_corr/is_weight_min"] == pytest.approx(0.4)
    assert m["rollout_corr/truncated_frac"] == pytest.approx(1 / 5)
    assert m["rollout_corr/rejected_frac"] == 0.0
    logs = [math.log(r) for r in (0.4, 1.5, 3.0, 1.2, 0.8)]
    assert m["rollout_corr/log_ratio_mean"] == pytest.approx(sum(logs) / 5, abs=1e-6)
    assert m["rollout_corr/k3_kl"] == pytest.approx(sum(math.exp(x) - x - 1 for x in logs) / 5, abs=1e-6)
    assert not w.requires_grad


def test_sequence_is_uses_the_product_of_token_ratios():
    w, _, m = _run(rollout_is="sequence")
    _close(w, [[1.8, 1.8, 1.8], [0.96, 0.96, 0.0]])
    assert m["rollout_corr/truncated_frac"] == 0.0
    w, _, m = _run(rollout_is="sequence", rollout_is_threshold=1.5)
    _close(w, [[1.5, 1.5, 1.5], [0.96, 0.96, 0.0]])
    assert m["rollout_corr/truncated_frac"] == pytest.approx(3 / 5)  # row0's 3 tokens of 5


def test_batch_normalisation_gives_mean_one():
    w, _, m = _run(rollout_is_batch_normalize=True)
    mean = (0.4 + 1.5 + 2.0 + 1.2 + 0.8) / 5  # over valid tokens
    _close(w, [[0.4 / mean, 1.5 / mean, 2.0 / mean], [1.2 / mean, 0.8 / mean, 0.0]])
    assert m["rollout_corr/is_batch_norm_factor"] == pytest.approx(mean)
    w, _, _ = _run(rollout_is="sequence", rollout_is_batch_normalize=True)
    seq_mean = (1.8 + 0.96) / 2  # over sequences, not tokens
    _close(w, [[1.8 / seq_mean] * 3, [0.96 / seq_mean, 0.96 / seq_mean, 0.0]])


def test_token_rejection_drops_tokens_outside_the_band():
    # band [1/2, 2]: row0 loses 0.4 and 3.0; the kept weights are normalised over kept tokens only
    w, mask, m = _run(rollout_rs="token", rollout_is_batch_normalize=True)
    _close(mask, [[0.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    kept_mean = (1.5 + 1.2 + 0.8) / 3
    _close(w, [[0.0, 1.5 / kept_mean, 0.0], [1.2 / kept_mean, 0.8 / kept_mean, 0.0]])
    assert m["rollout_corr/rejected_frac"] == pytest.approx(2 / 5)
    assert m["rollout_corr/rejected_seq_frac"] == pytest.approx(1 / 2)
    assert m["rollout_corr/is_weight_mean"] == pytest.approx(kept_mean)


def test_sequence_and_geometric_rejection_drop_whole_rows():
    # sequence, band [1/1.5, 1.5]: row0 product 1.8 is out, row1 0.96 is in
    w, mask, m = _run(rollout_is=None, rollout_rs="sequence", rollout_rs_threshold=1.5)
    assert w is None
    _close(mask, [[0.0, 0.0, 0.0], [1.0, 1.0, 0.0]])
    assert m["rollout_corr/rejected_frac"] == pytest.approx(3 / 5)
    assert m["rollout_corr/rejected_seq_frac"] == pytest.approx(1 / 2)
    assert "rollout_corr/is_weight_mean" not in m
    # with the default threshold (rollout_is_threshold = 2) row0's 1.8 is inside
    _, mask, _ = _run(rollout_is=None, rollout_rs="sequence")
    _close(mask, MASK)
    # geometric, band [1/1.2, 1.2]: row0 1.8^(1/3) = 1.216 is out, row1 0.96^(1/2) = 0.980 is in
    assert 1.8 ** (1 / 3) > 1.2 and 1 / 1.2 < 0.96**0.5 < 1.2
    _, mask, _ = _run(rollout_is=None, rollout_rs="geometric", rollout_rs_threshold=1.2)
    _close(mask, [[0.0, 0.0, 0.0], [1.0, 1.0, 0.0]])
    # sequence IS on the surviving row only, normalised to 1
    w, _, _ = _run(rollout_is="sequence", rollout_rs="sequence", rollout_rs_threshold=1.5,
                   rollout_is_batch_normalize=True)
    _close(w, [[0.0, 0.0, 0.0], [1.0, 1.0, 0.0]])


def test_bypass_mode_and_bad_settings():
    w, mask, m = _run(bypass_mode=True, rollout_rs="token")
    assert w is None and "rollout_corr/is_weight_mean" in m  # ppo_clip: the PPO ratio already corrects
    _close(mask, [[0.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    w, _, _ = _run(bypass_mode=True, loss_type="reinforce")
    _close(w, [[0.4, 1.5, 2.0], [1.2, 0.8, 0.0]])
    with pytest.raises(ValueError, match="'reinforce' applies in bypass mode only"):
        _run(loss_type="reinforce")
    with pytest.raises(ValueError, match="rollout_is='tokens' is invalid"):
        _run(rollout_is="tokens")
    with pytest.raises(ValueError, match=r"rollout_rs='seq': unknown criteria \['seq'\]"):
        _run(rollout_rs="seq")
    with pytest.raises(ValueError, match="rollout_rs_threshold=0.5 is invalid: must be > 1"):
        _run(rollout_rs="token", rollout_rs_threshold=0.5)


def _bypass_actor_cfg(**rc):
    return SimpleNamespace(clip_ratio=0.2, clip_ratio_low=None, clip_ratio_high=None, clip_ratio_c=3.0,
                           policy_loss=SimpleNamespace(loss_mode="bypass_mode", rollout_correction=_cfg(**rc)))


def test_bypass_mode_policy_loss():
    # old_log_prob are the rollout log-probs (0); the current ratios are [1.5, 3.0]; A = 1
    old = torch.zeros(1, 2)
    log_prob = torch.log(torch.tensor([[1.5, 3.0]])).requires_grad_(True)
    adv, mask = torch.ones(1, 2), torch.ones(1, 2)
    fn = ca.get_policy_loss_fn("bypass_mode")
    # reinforce with token IS (threshold 2): -w * A * log pi, w = [1.5, 2.0]
    loss, _, _, _ = fn(old, log_prob, adv, mask, "token-mean",
                       _bypass_actor_cfg(bypass_mode=True, loss_type="reinforce"))
    _close(loss, -(1.5 * math.log(1.5) + 2.0 * math.log(3.0)) / 2)
    loss.backward()
    _close(log_prob.grad, [[-1.5 / 2, -2.0 / 2]])
    # ppo_clip with token rejection: ratio 3 is dropped, ratio 1.5 clips to 1.2
    loss, clipfrac, _, _ = fn(old, log_prob.detach(), adv, mask, "token-mean",
                              _bypass_actor_cfg(bypass_mode=True, rollout_is=None, rollout_rs="token"))
    _close(loss, -1.2)
    _close(clipfrac, 1.0)
    with pytest.raises(ValueError, match="needs rollout_correction.bypass_mode=true"):
        fn(old, log_prob, adv, mask, "token-mean", _bypass_actor_cfg())


def test_verl_rejection_criteria_by_hand():
    """Ratios row0 [0.4, 1.5, 3.0], row1 [1.2, 0.8]. token_k1 0.5_2.0 drops 0.4 and 3.0; seq_mean_k1 0.9_1.1
    drops row0 (geometric mean 1.8 ** (1/3) = 1.216) and keeps row1 (0.96 ** 0.5 = 0.980); token_k2 with 0.1 drops
    the tokens with 0.5 * log(r)^2 > 0.1, i.e. r outside [0.64, 1.56]: 0.4 and 3.0 again."""
    _, mask, m = _run(rollout_is=None, rollout_rs="token_k1", rollout_rs_threshold="0.5_2.0")
    _close(mask, [[0, 1, 0], [1, 1, 0]])
    _close(torch.tensor(m["rollout_corr/rollout_rs_token_k1_masked_fraction"]), 2 / 5)
    _, mask, _ = _run(rollout_is=None, rollout_rs="seq_mean_k1", rollout_rs_threshold="0.9_1.1")
    _close(mask, [[0, 0, 0], [1, 1, 0]])
    _, mask, _ = _run(rollout_is=None, rollout_rs="token_k2", rollout_rs_threshold=0.1)
    _close(mask, [[0, 1, 0], [1, 1, 0]])
    # k3 per row, max: row0's largest token value is r=3.0: 3 - 1 - ln 3 = 0.901; row1's is r=0.8: 0.023
    _, mask, _ = _run(rollout_is=None, rollout_rs="seq_max_k3", rollout_rs_threshold=0.5)
    _close(mask, [[0, 0, 0], [1, 1, 0]])
    # two criteria, both must hold: token_k1 then seq_sum_k1 on the product (row1's 0.96 is in 0.95_1.05)
    _, mask, m = _run(rollout_is=None, rollout_rs="token_k1,seq_sum_k1", rollout_rs_threshold="0.5_2.0,0.95_1.05")
    _close(mask, [[0, 0, 0], [1, 1, 0]])
    assert "rollout_corr/rollout_rs_seq_sum_k1_masked_fraction" in m
    with pytest.raises(ValueError, match="needs one rollout_rs_threshold per criterion"):
        _run(rollout_rs="token_k1,seq_mean_k3", rollout_rs_threshold="0.5_2.0")
    with pytest.raises(ValueError, match="ratio band 'lower_upper'"):
        _run(rollout_rs="token_k1", rollout_rs_threshold="2.0_0.5")


def test_icepop_band_zeroes_weights_outside_and_keeps_the_tokens():
    w, mask, m = _run(rollout_is="token", rollout_is_threshold="0.5_2.0")
    _close(mask, MASK)  # the band does not reject
    _close(w, [[0.0, 1.5, 0.0], [1.2, 0.8, 0.0]])
    _close(torch.tensor(m["rollout_corr/truncated_frac"]), 2 / 5)
    with pytest.raises(ValueError, match="rollout_is_threshold='1_0.5' is invalid"):
        _run(rollout_is_threshold="1_0.5")


def test_rejection_lower_bound_moves_off_one_over_the_threshold():
    # token level, upper 2.0: default band [0.5, 2] drops 0.4 and 3.0; a lower bound of 0.3 keeps 0.4
    _, mask, _ = _run(rollout_is=None, rollout_rs="token", rollout_rs_threshold=2.0)
    _close(mask, [[0.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    _, mask, m = _run(rollout_is=None, rollout_rs="token", rollout_rs_threshold=2.0, rollout_rs_threshold_lower=0.3)
    _close(mask, [[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    assert m["rollout_corr/rejected_frac"] == pytest.approx(1 / 5)
    # sequence level: products 1.8 and 0.96; a lower bound of 0.97 drops row 1 only
    _, mask, _ = _run(rollout_is=None, rollout_rs="sequence", rollout_rs_threshold=2.0, rollout_rs_threshold_lower=0.97)
    _close(mask, [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])


def test_token_veto_drops_a_whole_row_with_one_catastrophic_token():
    # veto 0.5: row 0 holds 0.4 < 0.5 and goes whole; row 1 (1.2, 0.8) stays; the IS weights follow the mask
    w, mask, m = _run(rollout_token_veto_threshold=0.5)
    _close(mask, [[0.0, 0.0, 0.0], [1.0, 1.0, 0.0]])
    _close(w, [[0.0, 0.0, 0.0], [1.2, 0.8, 0.0]])
    assert m["rollout_corr/catastrophic_token_frac"] == pytest.approx(1 / 5)
    assert m["rollout_corr/veto_seq_frac"] == pytest.approx(1 / 2)
    assert m["rollout_corr/rejected_frac"] == pytest.approx(3 / 5)
    _, mask, m = _run(rollout_is=None, rollout_token_veto_threshold=0.3)  # no token below 0.3: nothing dropped
    _close(mask, MASK)
    assert m["rollout_corr/veto_seq_frac"] == 0.0


@pytest.mark.parametrize("over, message", [
    ({"rollout_rs": "token", "rollout_rs_threshold": 2.0, "rollout_rs_threshold_lower": 2.5},
     "rollout_correction.rollout_rs_threshold_lower=2.5 is invalid: must be in (0, 2.0)"),
    ({"rollout_rs_threshold_lower": 0.5}, "rollout_correction.rollout_rs_threshold_lower=0.5 needs rollout_rs"),
    ({"rollout_rs": "token_k1", "rollout_rs_threshold": "0.5_2.0", "rollout_rs_threshold_lower": 0.5},
     "rollout_correction.rollout_rs_threshold_lower=0.5 does not apply to verl's criteria (token_k1)"),
    ({"rollout_token_veto_threshold": 1.5}, "rollout_correction.rollout_token_veto_threshold=1.5 is invalid"),
])
def test_lower_bound_and_veto_refuse_bad_values(over, message):
    with pytest.raises(ValueError) as err:
        _run(**over)
    assert str(err.value).startswith(message), str(err.value)


def test_a_config_without_the_older_keys_still_works():
    cfg = _cfg()
    assert not hasattr(cfg, "rollout_token_veto_threshold")  # verl's current key set has neither
    w, _, _ = ca.compute_rollout_correction(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), cfg)
    _close(w, [[1.0, 1.0]])


def test_bypass_policy_loss_keeps_the_actors_own_loss_and_normalises_sequence_weights():
    from rlpost.algos.rollout_correction import bypass_policy_loss

    rollout = torch.zeros(2, 3)  # old_log_prob are the rollout's; the current ratios are RATIOS
    cur = torch.log(torch.tensor(RATIOS)).requires_grad_(True)
    adv = torch.ones(2, 3)
    rc = _cfg(rollout_is="sequence", rollout_is_threshold=2.0, rollout_is_batch_normalize=True, bypass_mode=True,
              loss_type="reinforce")
    (loss, *_), keep = bypass_policy_loss(None, rollout, cur, adv, MASK, "token-mean", None, rc)
    # row weights 1.8 and 0.96 (products, under the cap 2), over their mean 1.38
    w = [1.8 / 1.38, 0.96 / 1.38]
    logs = [[math.log(r) for r in RATIOS[0]], [math.log(r) for r in RATIOS[1][:2]]]
    want = -(w[0] * sum(logs[0]) + w[1] * sum(logs[1])) / 5
    assert float(loss) == pytest.approx(want, abs=1e-6)
    loss.backward()
    _close(cur.grad, [[-w[0] / 5] * 3, [-w[1] / 5, -w[1] / 5, 0.0]])
    _close(keep, MASK)
    # ppo_clip: the actor's configured loss (here GSPO) runs on the mask the rejection kept
    rc = _cfg(rollout_is=None, rollout_rs="token", rollout_rs_threshold=2.0, bypass_mode=True)
    gspo = ca.get_policy_loss_fn("gspo")
    (loss, *_), keep = bypass_policy_loss(gspo, rollout, cur.detach(), adv, MASK, "token-mean", None, rc)
    _close(keep, [[0.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    alone, *_ = gspo(rollout, cur.detach(), adv, keep, "token-mean", None, None)
    assert float(loss) == float(alone)
