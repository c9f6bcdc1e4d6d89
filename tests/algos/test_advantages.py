"""Advantage estimators against hand-computed examples."""

import math

import numpy as np
import pytest
import torch

from rlpost import algos as ca


def _close(actual, expected, atol=1e-5):
    # torch.allclose rather than torch.testing.assert_close: the latter costs seconds on first use
    expected = torch.as_tensor(expected, dtype=actual.dtype)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert torch.allclose(actual, expected, atol=atol, rtol=0), (actual, expected)


def _whiten(xs):
    """Hand whitening of a list with the unbiased variance (arithmetic spelled out)."""
    mean = sum(xs) / len(xs)
    var = sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)
    return [(x - mean) / math.sqrt(var + 1e-8) for x in xs]


def test_registry_holds_every_enum_member():
    assert ca.ADV_ESTIMATORS.names() == sorted(e.value for e in ca.AdvantageEstimator)
    assert ca.get_adv_estimator_fn(ca.AdvantageEstimator.GRPO) is ca.compute_grpo_outcome_advantage
    assert ca.get_adv_estimator_fn("gae") is ca.compute_gae_advantage_return
    with pytest.raises(ValueError, match="Did you mean 'grpo'"):
        ca.get_adv_estimator_fn("grop")


def test_gae_discounted():
    # gamma = lam = 0.5, rewards [0, 0, 1], values [1, 2, 3]:
    # t2: delta = 1 - 3 = -2, A = -2; t1: delta = 0 + 0.5*3 - 2 = -0.5, A = -0.5 + 0.25*(-2) = -1;
    # t0: delta = 0 + 0.5*2 - 1 = 0, A = 0.25*(-1) = -0.25. returns = A + V = [0.75, 1, 1].
    rewards = torch.tensor([[0.0, 0.0, 1.0]])
    values = torch.tensor([[1.0, 2.0, 3.0]])
    mask = torch.ones(1, 3)
    adv, ret = ca.compute_gae_advantage_return(rewards, values, mask, gamma=0.5, lam=0.5)
    _close(ret, [[0.75, 1.0, 1.0]])
    _close(adv, [_whiten([-0.25, -1.0, -2.0])])


def test_gae_skips_masked_positions():
    # mask [1, 0, 1, 1], gamma = lam = 1, rewards [0, 0, 0, 1], values [1, 9, 2, 3]:
    # t3: A = 1 - 3 = -2; t2: A = (0 + 3 - 2) + (-2) = -1; t1 masked: next value 2 and A = -1 carried;
    # t0: A = (0 + 2 - 1) + (-1) = 0. returns on valid tokens = A + V = [1, 1, 1].
    rewards = torch.tensor([[0.0, 0.0, 0.0, 1.0]])
    values = torch.tensor([[1.0, 9.0, 2.0, 3.0]])
    mask = torch.tensor([[1.0, 0.0, 1.0, 1.0]])
    adv, ret = ca.compute_gae_advantage_return(rewards, values, mask, gamma=1.0, lam=1.0)
    _close(ret, [[1.0, 0.0, 1.0, 1.0]])
    # raw A on valid tokens [0, -1, -2]: mean -1, unbiased var 1 -> whitened [1, 0, -1]
    _close(adv, [[1.0, 0.0, 0.0, -1.0]], atol=1e-4)
    with pytest.raises(ValueError, match="needs `values`"):
        ca.compute_advantage(rewards, mask, "gae")


def _grpo_batch():
    # groups: a -> scores [1, 0]; b -> [1, 1, 0]; c -> [2] (alone). Score sits on the last token (R = 2).
    rewards = torch.tensor([[0.0, 1.0], [0.0, 0.0], [0.0, 1.0], [1.0, 0.0], [0.0, 0.0], [0.0, 2.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 1.0], [1.0, 1.0], [1.0, 0.0], [1.0, 1.0], [1.0, 1.0]])
    index = np.array(["a", "a", "b", "b", "b", "c"], dtype=object)
    return rewards, mask, index


def test_grpo_and_dr_grpo():
    rewards, mask, index = _grpo_batch()
    eps = 1e-6
    std_a = math.sqrt((0.5**2 + 0.5**2) / 1)  # unbiased
    std_b = math.sqrt(((1 / 3) ** 2 * 2 + (2 / 3) ** 2) / 2)
    per_row = [0.5 / (std_a + eps), -0.5 / (std_a + eps), (1 / 3) / (std_b + eps), (1 / 3) / (std_b + eps),
               (-2 / 3) / (std_b + eps), 2.0 / (1.0 + eps)]
    adv, ret = ca.compute_grpo_outcome_advantage(rewards, mask, index)
    _close(adv, [[v * m for m in row] for v, row in zip(per_row, mask.tolist())])
    assert adv is ret
    dr, _ = ca.compute_advantage(rewards, mask, "grpo", index=index, norm_adv_by_std_in_grpo=False)
    per_row_dr = [0.5, -0.5, 1 / 3, 1 / 3, -2 / 3, 2.0]
    _close(dr, [[v * m for m in row] for v, row in zip(per_row_dr, mask.tolist())])
    with pytest.raises(ValueError, match="needs `index`"):
        ca.compute_grpo_outcome_advantage(rewards, mask, None)


def test_rloo():
    rewards, mask, index = _grpo_batch()
    # a: 1 - 0 = 1, 0 - 1 = -1; b: 1 - (1+0)/2 = 0.5 twice, 0 - (1+1)/2 = -1; c alone keeps 2.
    per_row = [1.0, -1.0, 0.5, 0.5, -1.0, 2.0]
    adv, ret = ca.compute_advantage(rewards, mask, "rloo", index=index)
    _close(adv, [[v * m for m in row] for v, row in zip(per_row, mask.tolist())])
    _close(ret, adv)


def test_reinforce_plus_plus():
    # gamma 0.5. row0 rewards [0,0,1] -> returns [0.25, 0.5, 1]; row1 rewards [0,2,0], mask [1,1,0]
    # -> returns [1, 2, 0].
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    adv, ret = ca.compute_advantage(rewards, mask, "reinforce_plus_plus", gamma=0.5)
    _close(ret, [[0.25, 0.5, 1.0], [1.0, 2.0, 0.0]])
    w = _whiten([0.25, 0.5, 1.0, 1.0, 2.0])
    _close(adv, [[w[0], w[1], w[2]], [w[3], w[4], 0.0]])


def test_reinforce_plus_plus_reads_gamma_from_a_verl_style_config():
    # verl calls it with config=AlgoConfig: gamma 0.5 from there, rewards [0, 0, 1] -> returns [0.25, 0.5, 1]
    from types import SimpleNamespace

    rewards, mask = torch.tensor([[0.0, 0.0, 1.0]]), torch.ones(1, 3)
    _, ret = ca.compute_reinforce_plus_plus_outcome_advantage(rewards, mask, config=SimpleNamespace(gamma=0.5))
    _close(ret, [[0.25, 0.5, 1.0]])
    _, ret = ca.compute_reinforce_plus_plus_outcome_advantage(rewards, mask)  # neither given: gamma 1
    _close(ret, [[1.0, 1.0, 1.0]])


def test_reinforce_plus_plus_carries_the_return_across_tool_turns():
    # [action, action, tool, tool, action, action, pad], reward 1 on the last action, gamma 0.5: the actions see
    # the compact sequence's returns [0.125, 0.25, 0.5, 1] (the tool tokens are not steps), the tool and pad
    # tokens get 0 - where a reset at every masked token would give the first turn 0.
    rewards = torch.tensor([[0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0]])
    _, ret = ca.compute_advantage(rewards, mask, "reinforce_plus_plus", gamma=0.5)
    _close(ret, [[0.125, 0.25, 0.0, 0.0, 0.5, 1.0, 0.0]])
    compact = ca.compute_advantage(torch.tensor([[0.0, 0.0, 0.0, 1.0]]), torch.ones(1, 4), "reinforce_plus_plus",
                                   gamma=0.5)[1]
    _close(ret[mask.bool()][None], compact.tolist())


def test_reinforce_plus_plus_baseline():
    # group a scores [1, 3] -> minus mean 2 -> [-1, 1]; group b alone: 5 - 0 = 5. Whitened over 6 tokens.
    rewards = torch.tensor([[0.0, 1.0], [0.0, 3.0], [0.0, 5.0]])
    mask = torch.ones(3, 2)
    adv, ret = ca.compute_advantage(rewards, mask, "reinforce_plus_plus_baseline", index=np.array(["a", "a", "b"]))
    w = _whiten([-1.0, -1.0, 1.0, 1.0, 5.0, 5.0])
    _close(adv, [[w[0], w[1]], [w[2], w[3]], [w[4], w[5]]])
    _close(ret, adv)


def test_remax():
    # reward-to-go row0 [1,0,2] -> [3,2,2]; row1 [0,3,0] mask [1,1,0] -> [3,3,0]; baselines 1.5 and 2.
    rewards = torch.tensor([[1.0, 0.0, 2.0], [0.0, 3.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    adv, ret = ca.compute_advantage(rewards, mask, "remax", reward_baselines=torch.tensor([1.5, 2.0]))
    _close(ret, [[3.0, 2.0, 2.0], [3.0, 3.0, 0.0]])
    _close(adv, [[1.5, 0.5, 0.5], [1.0, 1.0, 0.0]])
    with pytest.raises(ValueError, match="reward_baselines"):
        ca.compute_advantage(rewards, mask, "remax")


def test_opo_length_weighted_baseline():
    # group a: lengths 1, 2, 3 with scores 1, 0, 1 -> baseline (1*1 + 2*0 + 3*1) / 6 = 2/3.
    # group d alone: score 3, baseline 0.
    rewards = torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 1.0], [0.0, 3.0, 0.0]])
    mask = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    adv, _ = ca.compute_advantage(rewards, mask, "opo", index=np.array(["a", "a", "a", "d"]))
    _close(adv, [[1 / 3, 0, 0], [-2 / 3, -2 / 3, 0], [1 / 3, 1 / 3, 1 / 3], [3.0, 3.0, 0.0]])


def test_gpg():
    # a: [1, 0] mean 0.5; b: [1, 1] all equal -> M = 2 degenerate rows; c alone: 2 - 0.
    # B = 5, alpha = 5 / (5 - 2) = 5/3, F_norm = 1.
    rewards = torch.tensor([[1.0], [0.0], [1.0], [1.0], [2.0]])
    mask = torch.ones(5, 1)
    adv, _ = ca.compute_advantage(rewards, mask, "gpg", index=np.array(["a", "a", "b", "b", "c"]))
    alpha = 5 / 3
    _close(adv, [[alpha * 0.5], [alpha * -0.5], [0.0], [0.0], [alpha * 2.0]])


def test_shape_checks():
    with pytest.raises(ValueError, match=r"must both be \(B, R\)"):
        ca.compute_rloo_outcome_advantage(torch.ones(2, 3), torch.ones(2, 2), np.array([0, 0]))
    with pytest.raises(ValueError, match="index has 1 entries"):
        ca.compute_rloo_outcome_advantage(torch.ones(2, 3), torch.ones(2, 3), np.array([0]))


def _passk_batch():
    # group a: scores [1, 0] (best row 0); group b: [0, 3, 1] (best row 3, runner-up 1); R = 2.
    rewards = torch.tensor([[0.0, 1.0], [0.0, 0.0], [0.0, 0.0], [3.0, 0.0], [0.0, 1.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 1.0], [1.0, 0.0], [1.0, 0.0], [1.0, 1.0]])
    index = np.array(["a", "a", "b", "b", "b"], dtype=object)
    return rewards, mask, index


def test_grpo_passk_only_the_best_row_learns():
    rewards, mask, index = _passk_batch()
    eps = 1e-6
    std_a = math.sqrt(0.5)  # unbiased std of [1, 0]
    std_b = math.sqrt(((-4 / 3) ** 2 + (5 / 3) ** 2 + (-1 / 3) ** 2) / 2)  # of [0, 3, 1]: sqrt(7/3)
    per_row = [(1 - 0) / (std_a + eps), 0.0, 0.0, (3 - 1) / (std_b + eps), 0.0]
    adv, ret = ca.compute_advantage(rewards, mask, "grpo_passk", index=index)
    _close(adv, [[v * m for m in row] for v, row in zip(per_row, mask.tolist())])
    assert adv is ret
    raw, _ = ca.compute_advantage(rewards, mask, "grpo_passk", index=index, norm_adv_by_std_in_grpo=False)
    _close(raw, [[1.0, 1.0], [0.0, 0.0], [0.0, 0.0], [2.0, 0.0], [0.0, 0.0]])


def test_grpo_passk_ties_and_group_size():
    # a tie for the best: the first row gets max - second = 0, so nothing learns
    rewards = torch.tensor([[2.0], [2.0], [1.0]])
    adv, _ = ca.compute_grpo_passk_outcome_advantage(rewards, torch.ones(3, 1), np.array([7, 7, 7]))
    _close(adv, [[0.0], [0.0], [0.0]])
    with pytest.raises(ValueError, match="at least 2 responses per prompt"):
        ca.compute_grpo_passk_outcome_advantage(rewards, torch.ones(3, 1), np.array([7, 7, 8]))


def _loop_grpo(scores, index, eps, norm):
    """Reference: verl's per-group loop (mean, unbiased std; a group of one gets mean 0, std 1)."""
    out = []
    for i, s in enumerate(scores):
        group = [scores[j] for j in range(len(scores)) if index[j] == index[i]]
        mean = sum(group) / len(group) if len(group) > 1 else 0.0
        std = math.sqrt(sum((g - mean) ** 2 for g in group) / (len(group) - 1)) if len(group) > 1 else 1.0
        out.append((s - mean) / (std + eps) if norm else s - mean)
    return out


def _loop_rloo(scores, index):
    """Reference: verl's loop rloo, s_i - mean of the others; a group of one keeps its score."""
    out = []
    for i, s in enumerate(scores):
        others = [scores[j] for j in range(len(scores)) if index[j] == index[i] and j != i]
        out.append(s - sum(others) / len(others) if others else s)
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_vectorized_names_match_the_loop_definitions(seed):
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randn(13, 4, generator=g, dtype=torch.float64)
    mask = (torch.rand(13, 4, generator=g) > 0.3).double()
    index = np.array([int(v) for v in torch.randint(0, 5, (13,), generator=g)])
    scores = rewards.sum(-1).tolist()
    for norm in (True, False):
        adv, _ = ca.compute_advantage(rewards, mask, "grpo_vectorized", index=index, norm_adv_by_std_in_grpo=norm)
        want = torch.tensor(_loop_grpo(scores, index, 1e-6, norm), dtype=torch.float64)
        _close(adv, want.unsqueeze(-1) * mask)
    adv, _ = ca.compute_advantage(rewards, mask, "rloo_vectorized", index=index)
    _close(adv, torch.tensor(_loop_rloo(scores, index), dtype=torch.float64).unsqueeze(-1) * mask)


def test_vectorized_names_by_hand():
    rewards, mask, index = _grpo_batch()
    # rloo: a: 1 - 0, 0 - 1; b: 1 - 0.5 twice, 0 - 1; c alone keeps 2 (as the loop rloo)
    adv, _ = ca.compute_advantage(rewards, mask, "rloo_vectorized", index=index)
    _close(adv, [[v * m for m in row] for v, row in zip([1.0, -1.0, 0.5, 0.5, -1.0, 2.0], mask.tolist())])
    dr, _ = ca.compute_advantage(rewards, mask, "grpo_vectorized", index=index, norm_adv_by_std_in_grpo=False)
    _close(dr, [[v * m for m in row] for v, row in zip([0.5, -0.5, 1 / 3, 1 / 3, -2 / 3, 2.0], mask.tolist())])


def test_gdpo_normalises_each_component_in_its_group_then_whitens():
    """Groups a = rows 0, 1 and b = rows 2, 3; components acc [1, 0, 0, 1], fmt [0, 1, 0, 1], weights [1, 0.5].
    Two-member groups normalise to +-1/sqrt(2) (unbiased std of [1, 0] is 1/sqrt(2)): acc -> [.707, -.707,
    -.707, .707], fmt -> [-.707, .707, -.707, .707]; weighted sums [.354, -.354, -1.061, 1.061], whitened over
    the valid tokens (two per row, so each value twice)."""
    from types import SimpleNamespace

    s = 1 / math.sqrt(2)
    sums = [s - 0.5 * s, -s + 0.5 * s, -s - 0.5 * s, s + 0.5 * s]
    fields = {"acc": np.array([1.0, 0.0, 0.0, 1.0], dtype=object), "fmt": np.array([0, 1, 0, 1], dtype=object)}
    cfg = SimpleNamespace(gdpo_reward_keys=["acc", "fmt"], gdpo_reward_weights=[1.0, 0.5])
    adv, ret = ca.compute_advantage(torch.zeros(4, 2), torch.ones(4, 2), "gdpo", index=np.array(["a", "a", "b", "b"]),
                                    config=cfg, non_tensor_batch=fields)
    expected = _whiten([v for v in sums for _ in range(2)])
    _close(adv, torch.tensor(expected).reshape(4, 2), atol=1e-4)
    assert torch.equal(adv, ret)
    # the rows' own total score plays no part; a missing component or no keys is named
    with pytest.raises(ValueError, match=r"gdpo reward components \['fmt'\] are not in the batch"):
        ca.compute_advantage(torch.zeros(4, 2), torch.ones(4, 2), "gdpo", index=np.array(["a", "a", "b", "b"]),
                             config=cfg, non_tensor_batch={"acc": fields["acc"]})
    with pytest.raises(ValueError, match="needs algorithm.gdpo_reward_keys"):
        ca.compute_advantage(torch.zeros(4, 2), torch.ones(4, 2), "gdpo", index=np.array(["a", "a", "b", "b"]),
                             config=SimpleNamespace(gdpo_reward_keys=None, gdpo_reward_weights=None))


def _otb_inputs():
    """Group a = rows 0 (3 tokens) and 1 (2 tokens), group b = row 2 (1 token); pi and sum p^2 chosen so that
    w = 1 - 2 pi + sum p^2 is 0.5 per token in row 0 and [1.0, 0.5] in row 1."""
    mask = torch.tensor([[1.0, 1, 1], [1, 1, 0], [1, 0, 0]])
    rewards = torch.tensor([[0.0, 0, 1], [0, 2, 0], [0.7, 0, 0]])
    pi = torch.tensor([[0.5, 0.5, 0.5], [0.25, 0.5, 0.5], [0.5, 0.5, 0.5]])
    return rewards, mask, np.array(["a", "a", "b"]), pi.log(), torch.full((3, 3), 0.5)


def test_optimal_token_baseline_by_hand():
    """W (cumulative w): row 0 [0.5, 1.0, 1.5], row 1 [1.0, 1.5]; returns G: row 0 [1, 1, 1], row 1 [2, 2].
    B_0 = (1 x 0.5 + 2 x 1.0) / 1.5 = 5/3; B_1 = (1 x 1.0 + 2 x 1.5) / 2.5 = 1.6; B_2 = 1 (row 0 alone), but row 0
    is the group's single longest row past the second-longest: no baseline there (zero tail). Row 2 is a group
    of one: A = G."""
    rewards, mask, index, logp, pi2 = _otb_inputs()
    adv, ret = ca.compute_advantage(rewards, mask, "optimal_token_baseline", index=index, old_log_probs=logp,
                                    sum_pi_squared=pi2)
    _close(ret, [[1, 1, 1], [2, 2, 0], [0.7, 0, 0]])
    _close(adv, [[1 - 5 / 3, 1 - 1.6, 1.0], [2 - 5 / 3, 2 - 1.6, 0], [0.7, 0, 0]])
    adv, _ = ca.compute_optimal_token_baseline_advantage(rewards, mask, index, logp, pi2, handle_zero_tail=False)
    assert adv[0, 2].item() == pytest.approx(0.0, abs=1e-6)  # B_2 = row 0's own return
    # rollout importance weights scale w by rho^2: rho = 2 on row 1 gives W = [4, 6]; B_0 = (0.5 + 8) / 4.5
    rho = torch.ones(3, 3)
    rho[1] = 2.0
    adv, _ = ca.compute_advantage(rewards, mask, "optimal_token_baseline", index=index, old_log_probs=logp,
                                  sum_pi_squared=pi2, rollout_is_weights=rho)
    assert adv[0, 0].item() == pytest.approx(1 - 8.5 / 4.5, abs=1e-5)
    with pytest.raises(ValueError, match="calculate_sum_pi_squared=true"):
        ca.compute_advantage(rewards, mask, "optimal_token_baseline", index=index, old_log_probs=logp)


def test_tir_optimal_token_baseline_aligns_the_trained_tokens():
    """Row 0 trains positions 0, 2, 3 (position 1 is a tool's output), row 1 positions 0, 1; w = 0.5 per trained
    token. Aligned by trained-token count: W row 0 [0.5, 1.0, 1.5], row 1 [0.5, 1.0]; G row 0 [1, 1, 1], row 1
    [3, 3]. B = [(0.5 + 1.5) / 1, (1 + 3) / 2] = [2, 2], then row 0's third trained token alone (zero tail)."""
    mask = torch.tensor([[1.0, 0, 1, 1], [1, 1, 0, 0]])
    rewards = torch.tensor([[0.0, 0, 0, 1], [0, 3, 0, 0]])
    logp, pi2 = torch.full((2, 4), 0.5).log(), torch.full((2, 4), 0.5)
    adv, ret = ca.compute_advantage(rewards, mask, "tir_optimal_token_baseline", index=np.array(["a", "a"]),
                                    old_log_probs=logp, sum_pi_squared=pi2)
    _close(adv, [[-1, 0, -1, 1], [1, 1, 0, 0]])
    _close(ret, [[1, 1, 1, 1], [3, 3, 0, 0]])
    # without a tool token in between both estimators agree
    rewards, mask, index, logp, pi2 = _otb_inputs()
    _close(ca.compute_advantage(rewards, mask, "tir_optimal_token_baseline", index=index, old_log_probs=logp,
                                sum_pi_squared=pi2)[0],
           ca.compute_advantage(rewards, mask, "optimal_token_baseline", index=index, old_log_probs=logp,
                                sum_pi_squared=pi2)[0])


def test_every_estimator_takes_the_log_prob_statistics_keywords():
    """The uniform call passes old_log_probs / sum_pi_squared / rollout_is_weights to every estimator."""
    rewards, mask, index, logp, pi2 = _otb_inputs()
    index = np.array(["a", "a", "a"])
    for name in ca.ADV_ESTIMATORS.names():
        if name == "gdpo":
            continue  # needs its reward components (tested above)
        adv, _ = ca.compute_advantage(rewards, mask, name, index=index, values=torch.zeros(3, 3),
                                      non_tensor_batch={"acc": np.array([1, 0, 1], dtype=object)},
                                      reward_baselines=torch.zeros(3), old_log_probs=logp, sum_pi_squared=pi2,
                                      rollout_is_weights=torch.ones(3, 3))
        assert adv.shape == (3, 3) and torch.isfinite(adv).all(), name


def test_codapo_values_weights_and_focused_questions_by_hand():
    """Questions a (rows 0-1) and b (rows 2-3). a: one of two correct (d = 0.5), mean token log-probs -1 and -3
    -> c = exp(-2), v = exp(-2) x (1 - 0) = 0.1353. b: both correct (d = 0), c = exp(-0.5), v = c x (1 - 1) = 0.
    GRPO on scores [1, 0, 1, 1]: a -> +-0.7071, b -> 0 (equal scores). CoDaPO = (v + 0.1) x GRPO."""
    from types import SimpleNamespace

    from rlpost.algos.codapo import question_values, round_robin, top_questions

    mask = torch.tensor([[1.0, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 0]])
    logp = torch.tensor([[-1.0, -1, 0], [-3, -3, -3], [-0.5, 0, 0], [-0.5, -0.5, 0]])
    rewards = torch.zeros(4, 3)
    rewards[0, 1], rewards[2, 0], rewards[3, 1] = 1.0, 1.0, 1.0
    index = np.array(["a", "a", "b", "b"])
    values = question_values(torch.tensor([1.0, 0, 1, 1]), logp, mask, index)
    _close(values, [math.exp(-2)] * 2 + [0.0] * 2)
    cfg = SimpleNamespace(codapo_top_k=None, codapo_weight_offset=None, codapo_accuracy_key=None)  # verl's defaults
    fields = {"acc": np.array([1, 0, True, 1], dtype=object)}
    adv, _ = ca.compute_advantage(rewards, mask, "codapo", index=index, config=cfg, non_tensor_batch=fields,
                                  old_log_probs=logp)
    w = math.exp(-2) + 0.1
    _close(adv, [[w * 0.70711, w * 0.70711, 0], [-w * 0.70711] * 3, [0, 0, 0], [0, 0, 0]], atol=1e-4)
    # the engine's own log-probs, when the rollout returned them, set the confidence instead
    adv_rollout, _ = ca.compute_advantage(rewards, mask, "codapo", index=index, config=cfg, non_tensor_batch=fields,
                                          old_log_probs=logp, rollout_log_probs=torch.zeros(4, 3))
    _close(adv_rollout[0], [1.1 * 0.70711, 1.1 * 0.70711, 0], atol=1e-4)  # c = 1, v = 1
    assert top_questions(values, index, 1) == ["a"] and top_questions(values, index, 2) == ["a", "b"]
    assert top_questions(torch.zeros(4), index, 1, order=["b", "a"]) == ["b"]  # ties: the batch's prompt order
    # a response rejected whole (its mask all 0) leaves confidence to the others: b's c stays exp(-0.5)
    rejected = mask.clone()
    rejected[3] = 0
    _close(question_values(torch.tensor([1.0, 0, 1, 0]), logp, rejected, index)[2:],
           [math.exp(-0.5) * (1 - 4 * 0.0 ** 2)] * 2)
    assert round_robin([2, 0], 5) == [2, 0, 2, 0, 2]
    with pytest.raises(ValueError, match="batch lacks .*reward.reward_manager.name=dapo"):
        ca.compute_advantage(rewards, mask, "codapo", index=index, config=cfg, non_tensor_batch={},
                             old_log_probs=logp)
