"""rollout_probs_diff against a hand-computed example."""

import math

import torch

from rlpost.rollout.drift import rollout_probs_diff


def test_probs_diff_hand_computed():
    rollout = torch.log(torch.tensor([[0.5, 0.2, 0.9], [0.4, 0.3, 0.1]]))
    actor = torch.log(torch.tensor([[0.4, 0.2, 0.1], [0.7, 0.3, 0.1]]))
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    # masked |p_r - p_a|: 0.1, 0.0, 0.3 -> mean 0.4/3, max 0.3, population std
    m = rollout_probs_diff(rollout, actor, mask)
    mean = 0.4 / 3
    std = math.sqrt(((0.1 - mean) ** 2 + mean**2 + (0.3 - mean) ** 2) / 3)
    assert math.isclose(m["training/rollout_probs_diff_mean"], mean, abs_tol=1e-6)
    assert math.isclose(m["training/rollout_probs_diff_max"], 0.3, abs_tol=1e-6)
    assert math.isclose(m["training/rollout_probs_diff_std"], std, abs_tol=1e-6)


def test_probs_diff_empty_mask_is_zero():
    z = torch.zeros(2, 3)
    assert rollout_probs_diff(z, z, z.long()) == {
        "training/rollout_probs_diff_mean": 0.0,
        "training/rollout_probs_diff_max": 0.0,
        "training/rollout_probs_diff_std": 0.0,
    }
