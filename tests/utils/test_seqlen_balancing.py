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


def test_ceildiv_roundup_reverse_idx():
    from rlpost.utils.seqlen_balancing import ceildiv, get_reverse_idx, roundup_divisible

    assert [ceildiv(7, 3), ceildiv(6, 3), ceildiv(1, 4)] == [3, 2, 1]
    assert [roundup_divisible(7, 4), roundup_divisible(8, 4)] == [8, 8]
    assert get_reverse_idx([2, 0, 1]) == [1, 2, 0]  # out[idx[i]] = i


def test_prepare_and_restore_dynamic_batch():
    from rlpost.protocol import DataProto
    from rlpost.utils.seqlen_balancing import prepare_dynamic_batch, restore_dynamic_batch

    lengths = [9, 2, 7, 3, 5, 1, 8, 4]
    data = DataProto.from_dict({"attention_mask": _mask(lengths), "row": torch.arange(8)},
                               {"uid": [f"u{i}" for i in range(8)]}, {"temperature": 1.0})
    micro, idx = prepare_dynamic_batch(data, max_token_len=12)
    assert all(int(m.batch["attention_mask"].sum()) <= 12 for m in micro) and len(micro) == 4
    assert all(m.batch["row"].tolist() == g for m, g in zip(micro, idx))
    assert all(list(m.non_tensor_batch["uid"]) == [f"u{i}" for i in g] for m, g in zip(micro, idx))
    micro[0].meta_info["temperature"] = 0.5  # each micro-batch has its own copy
    assert data.meta_info["temperature"] == 1.0
    outputs = torch.cat([m.batch["row"] * 10 for m in micro])
    assert restore_dynamic_batch(outputs, idx).tolist() == [i * 10 for i in range(8)]
    more, idx6 = prepare_dynamic_batch(data, max_token_len=12, min_num_micro_batch=5, num_batches_divided_by=3)
    assert len(more) == 6 and sorted(i for g in idx6 for i in g) == list(range(8))
    with pytest.raises(ValueError, match="9 micro-batches asked of 8 rows"):
        prepare_dynamic_batch(data, max_token_len=12, min_num_micro_batch=9)


def test_restore_dynamic_batch_nested():
    from rlpost.utils.seqlen_balancing import restore_dynamic_batch

    nested = torch.nested.as_nested_tensor([torch.tensor([1.0]), torch.tensor([2.0, 2.0])], layout=torch.jagged)
    back = restore_dynamic_batch(nested, [[1], [0]])
    assert [t.tolist() for t in back.unbind()] == [[2.0, 2.0], [1.0]]


def test_group_balanced_partitions_keep_uids_together():
    from rlpost.utils.seqlen_balancing import get_group_balanced_partitions

    # group workloads (24576 s + s^2 per row): a (rows 0-1) 491720, b (2-3) 49154, c (4-5) 442530, d (6-7) 98312;
    # two groups per partition: {a, b} 540874 vs {c, d} 540842 is the closest split
    parts = get_group_balanced_partitions([10, 10, 1, 1, 9, 9, 2, 2], list("aabbccdd"), 2)
    assert sorted(parts) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    with pytest.raises(ValueError, match="2 uid groups cannot fill 3"):
        get_group_balanced_partitions([1, 1, 1], list("aab"), 3)
