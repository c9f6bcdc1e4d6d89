"""Ulysses pieces that need no process group: slicing a packed row, and the KV-head repetition that keeps each
rank's query heads with their own KV heads."""

import torch

from rlpost.engine.ulysses import SequenceParallel, _repeat_kv_for_group, shard_packed_row


def test_packed_row_is_padded_and_sliced_per_rank():
    ids = torch.tensor([[5, 6, 7, 8, 9, 10, 11]])
    pos = torch.tensor([[0, 1, 2, 0, 1, 0, 1]])
    lens = torch.tensor([3, 0, 2, 2])  # an empty row packs nothing
    shards = [shard_packed_row(ids, pos, lens, SequenceParallel(None, 4, r)) for r in range(4)]
    assert [s.input_ids.tolist() for s in shards] == [[[5, 6]], [[7, 8]], [[9, 10]], [[11, 0]]]
    assert [s.position_ids.tolist() for s in shards] == [[[0, 1]], [[2, 0]], [[1, 0]], [[1, 0]]]
    assert [s.start for s in shards] == [0, 2, 4, 6] and {s.length for s in shards} == {2}
    assert shards[0].bounds == (0, 3, 5, 7, 8)  # the one pad token is a sequence of its own
    even = shard_packed_row(ids[:, :6], pos[:, :6], torch.tensor([3, 2, 1]), SequenceParallel(None, 2, 1))
    assert even.input_ids.tolist() == [[8, 9, 10]] and even.bounds == (0, 3, 5, 6)
    # mrope positions (3, 1, N): every axis padded with 0, 1, ... and sliced like the ids
    mrope = torch.stack([pos, pos * 10, pos * 100])
    last = shard_packed_row(ids, mrope, lens, SequenceParallel(None, 4, 3))
    assert last.position_ids.shape == (3, 1, 2) and last.position_ids[:, 0].tolist() == [[1, 0], [10, 0], [100, 0]]


def test_kv_heads_repeat_so_each_rank_keeps_its_query_groups():
    """8 query heads, 2 KV heads (query heads 0-3 use KV 0, 4-7 use KV 1), SP 4: each rank gets 2 query heads and
    must get the KV head those use."""
    key = torch.arange(2.0).reshape(1, 2, 1, 1).expand(1, 2, 3, 1)
    rep_k, rep_v = _repeat_kv_for_group(key, key.clone(), 4)
    assert rep_k.shape == (1, 4, 3, 1) and torch.equal(rep_k, rep_v)
    for rank in range(4):
        q_heads = range(2 * rank, 2 * rank + 2)
        kv = rep_k[0, rank, 0, 0].item()  # the one KV head this rank receives
        assert all(h // 4 == kv for h in q_heads)
    assert _repeat_kv_for_group(key, key, 2)[0] is key  # 2 KV heads split over 2 ranks as they are
    three = torch.zeros(1, 3, 2, 1)
    assert _repeat_kv_for_group(three, three, 2)[0].shape[1] == 6  # lcm(3, 2)


def test_attention_is_selected_only_when_the_heads_split():
    import pytest
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from rlpost.engine.ulysses import ATTENTION_NAME, use_ulysses_attention

    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=32, hidden_size=32, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1, head_dim=16))
    with pytest.raises(ValueError, match="ulysses_sequence_parallel_size=4 must divide the model's 2 attention"):
        use_ulysses_attention(model, 4)
    use_ulysses_attention(model, 2)
    assert model.config._attn_implementation == ATTENTION_NAME
    ids = torch.tensor([[3, 4, 5, 0], [6, 7, 8, 9]])
    mask = (ids != 0).long()
    plain = model(input_ids=ids, attention_mask=mask).logits  # no shard: plain SDPA with the padding mask
    model.set_attn_implementation("sdpa")
    torch.testing.assert_close(plain, model(input_ids=ids, attention_mask=mask).logits)


def test_linear_attention_models_are_refused_by_name():
    """Sliding windows work under Ulysses (tests/utils/test_model_contract.py); a recurrent state cannot be split."""
    import pytest

    from rlpost.utils.tiny_families import family_model
    from rlpost.engine.ulysses import use_ulysses_attention

    model = family_model("qwen3_next", 32)
    with pytest.raises(NotImplementedError, match="not supported yet: ulysses_sequence_parallel_size=2 with a "
                                                  "model that has linear-attention layers; set it to 1"):
        use_ulysses_attention(model, 2)
