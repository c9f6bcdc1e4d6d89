"""DAPO dynamic sampling: which rows survive, and the per-row metric by name."""

import numpy as np
import pytest
import torch

from rlpost import algos as ca


def test_kept_group_rows_keeps_groups_that_disagree_in_order():
    uids = np.array(["a", "b", "a", "c", "b", "d", "d", "a"], dtype=object)
    acc = np.array([1.0, 0.0, 0.0, 1.0, 0.0, 0.5, 0.5, 1.0])
    # a: [1, 0, 1] varies -> rows 0, 2, 7; b: [0, 0] constant -> dropped; c: one row -> kept; d: [0.5, 0.5] dropped
    kept = ca.kept_group_rows(uids, acc)
    assert kept.tolist() == [0, 2, 3, 7]
    assert kept.dtype == np.int64


def test_kept_group_rows_treats_round_off_equal_values_as_constant():
    # np.std([0.1, 0.1, 0.1]) is ~1e-17, not 0; the group is still constant
    assert ca.kept_group_rows(np.array([5, 5, 5]), np.array([0.1, 0.1, 0.1])).tolist() == []
    assert ca.kept_group_rows(np.array([], dtype=object), np.array([])).tolist() == []
    with pytest.raises(ValueError, match="must both be"):
        ca.kept_group_rows(np.array([1, 2]), np.array([1.0]))


def test_group_metric_by_name():
    scores = torch.tensor([[0.0, 1.0], [0.5, 0.0]])
    rewards = torch.tensor([[0.0, 0.75], [0.5, -0.25]])
    extra = {"acc": [1, 0], "format": [0.5, 0.25]}
    assert ca.group_metric("score", scores, rewards, extra).tolist() == [1.0, 0.5]
    assert ca.group_metric("seq_reward", scores, rewards, extra).tolist() == [1.0, 0.5]
    assert ca.group_metric("seq_final_reward", scores, rewards, extra).tolist() == [0.75, 0.25]
    assert ca.group_metric("acc", scores, rewards, extra).tolist() == [1.0, 0.0]
    assert ca.group_metric("format", scores, rewards, extra).tolist() == [0.5, 0.25]
    with pytest.raises(ValueError, match=r"metric='acc' is invalid: must be one of \['score', 'seq_final_reward'"):
        ca.group_metric("acc", scores, rewards, {})
    with pytest.raises(ValueError, match="has 1 values for 2 rows"):
        ca.group_metric("acc", scores, rewards, {"acc": [1]})
