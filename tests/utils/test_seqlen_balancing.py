"""Dynamic batch size: token-budget micro-batches, balance, order restore."""

import pytest
import torch

from rlpost.utils.seqlen_balancing import partition_balanced, rearrange_micro_batches, reverse_indices


def _mask(lengths, width=10):
    return (torch.arange(width)[None] < torch.tensor(lengths)[:, None]).long()


def test_partition_balanced_by_hand():
    groups = partition_balanced([5, 4, 3, 3, 1], 2)
    sums = sorted(sum([5, 4, 3, 3, 1][i] for i in g) for g in groups)
    assert sums == [8, 8]
    assert sorted(i for g in groups for i in g) == [0, 1, 2, 3, 4]


def test_rearrange_respects_budget_and_restores_order():
    lengths = [9, 2, 7, 3, 5, 1, 8, 4]
    groups = rearrange_micro_batches(_mask(lengths), max_token_len=12)
    assert all(sum(lengths[i] for i in g) <= 12 for g in groups)
    assert len(groups) == 4  # 39 tokens need at least 4 micro-batches of 12
    flat = torch.tensor([i for g in groups for i in g])
    values = torch.tensor(lengths)[flat]
    assert values[reverse_indices(groups)].tolist() == lengths


def test_row_longer_than_budget_raises():
    with pytest.raises(ValueError, match="max_token_len"):
        rearrange_micro_batches(_mask([3, 9]), max_token_len=8)
