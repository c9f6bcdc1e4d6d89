"""verl's small helper modules under their verl paths: `torch_functional`, `hdfs_io`, `device`."""

import pytest
import torch

import rlpost.utils.torch_functional as verl_F
from rlpost.utils import device, hdfs_io


def test_response_mask_keeps_the_first_end_token_and_nothing_after():
    ids = torch.tensor([[5, 6, 2, 7, 2], [5, 6, 7, 8, 9], [2, 5, 5, 5, 5]])
    assert verl_F.get_response_mask(ids, eos_token=2).tolist() == [[1, 1, 1, 0, 0], [1] * 5, [1, 0, 0, 0, 0]]
    # several end tokens: whichever comes first ends the row
    assert verl_F.get_response_mask(ids, eos_token=[7, 2], dtype=torch.bool).tolist() == [
        [True, True, True, False, False], [True, True, True, False, False], [True, False, False, False, False]]
    assert verl_F.get_eos_mask is verl_F.get_response_mask


def test_pad_sequence_to_length_pads_the_last_dim_on_either_side():
    x = torch.tensor([[1, 2], [3, 4]])
    assert verl_F.pad_sequence_to_length(x, 4, 0).tolist() == [[1, 2, 0, 0], [3, 4, 0, 0]]
    assert verl_F.pad_sequence_to_length(x, 3, 9, left_pad=True).tolist() == [[9, 1, 2], [9, 3, 4]]
    assert verl_F.pad_sequence_to_length(x, 1, 0) is x  # already long enough: unchanged
    assert verl_F.pad_2d_list_to_length([[1], [2, 3, 4]], 0).tolist() == [[1, 0, 0], [2, 3, 4]]
    assert verl_F.pad_2d_list_to_length([[1]], 0, max_length=3).tolist() == [[1, 0, 0]]


@pytest.mark.parametrize("truncation, ids", [
    ("left", [3, 4, 5, 6]), ("right", [1, 2, 3, 4]), ("middle", [1, 2, 5, 6]),
])
def test_postprocess_data_truncates_as_asked(truncation, ids):
    x = torch.tensor([[1, 2, 3, 4, 5, 6]])
    out_ids, out_mask = verl_F.postprocess_data(x, torch.ones_like(x), 4, pad_token_id=0, truncation=truncation)
    assert out_ids.tolist() == [ids] and out_mask.tolist() == [[1, 1, 1, 1]]


def test_postprocess_data_left_pads_and_refuses_long_input_on_error():
    x = torch.tensor([[7, 8]])
    out_ids, out_mask = verl_F.postprocess_data(x, torch.ones_like(x), 4, pad_token_id=0)
    assert out_ids.tolist() == [[0, 0, 7, 8]] and out_mask.tolist() == [[0, 0, 1, 1]]
    with pytest.raises(ValueError, match="max_length=1 .*truncation='error'"):
        verl_F.postprocess_data(x, torch.ones_like(x), 1, pad_token_id=0)
    with pytest.raises(ValueError, match="truncation='sideways' is not one of left, right, middle, error"):
        verl_F.postprocess_data(x, torch.ones_like(x), 4, pad_token_id=0, truncation="sideways")


def test_tokenize_and_postprocess_data_with_a_real_tokenizer(tiny_model_dir):
    from rlpost.utils import hf_tokenizer

    tok = hf_tokenizer(tiny_model_dir)
    expected = tok("12 + 34", add_special_tokens=False)["input_ids"]
    ids, mask = verl_F.tokenize_and_postprocess_data("12 + 34", tok, len(expected) + 2, tok.pad_token_id)
    assert ids.tolist() == [[tok.pad_token_id] * 2 + expected] and mask.sum().item() == len(expected)


def test_logprob_and_entropy_helpers_match_torch():
    logits = torch.randn(2, 3, 11, generator=torch.Generator().manual_seed(0))
    labels = torch.tensor([[0, 4, 10], [3, 3, 1]])
    want = torch.log_softmax(logits, -1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(verl_F.logprobs_from_logits(logits, labels, inplace_backward=False), want)
    p = torch.softmax(logits, -1)
    entropy = -(p * torch.log_softmax(logits, -1)).sum(-1)
    torch.testing.assert_close(verl_F.entropy_from_logits(logits), entropy)
    torch.testing.assert_close(verl_F.entropy_from_logits_with_chunking(logits, chunk_size=2), entropy)
    assert verl_F.clip_by_value(torch.tensor([-2.0, 0.5, 3.0]), -1.0, 1.0).tolist() == [-1.0, 0.5, 1.0]
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert verl_F.masked_mean(labels.float(), mask).item() == pytest.approx((0 + 4 + 3) / 3)


def test_hdfs_io_works_on_local_paths_and_names_a_remote_one(tmp_path):
    src = tmp_path / "local"
    src.mkdir()
    (src / "train.parquet").write_bytes(b"rows")
    dst = tmp_path / "published" / "gsm8k"
    hdfs_io.makedirs(str(dst), exist_ok=True)  # verl's preprocess scripts: makedirs, then copy into it
    assert hdfs_io.copy(src=str(src), dst=str(dst)) is True
    assert (dst / "train.parquet").read_bytes() == b"rows" and hdfs_io.exists(f"file://{dst}/train.parquet")
    hdfs_io.copy(str(src / "train.parquet"), str(tmp_path / "one.parquet"))
    assert (tmp_path / "one.parquet").read_bytes() == b"rows"
    with pytest.raises(ValueError, match="not supported yet: remote path 'hdfs://nn/data'"):
        hdfs_io.makedirs("hdfs://nn/data")


def test_device_helpers_on_this_machine():
    name = device.get_device_name()
    assert name == ("cuda" if torch.cuda.is_available() else "cpu")
    assert device.get_torch_device() is getattr(torch, name)
    assert device.get_nccl_backend() == ("nccl" if name == "cuda" else "gloo")
    assert device.is_npu_available is False and device.get_visible_devices_keyword() == "CUDA_VISIBLE_DEVICES"
    assert device.get_device_id() == (torch.cuda.current_device() if name == "cuda" else "cpu")


def test_position_ids_of_left_padded_rows():
    from rlpost.utils.model import compute_position_id_with_mask

    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    assert compute_position_id_with_mask(mask).tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 3, 4]]


def test_seqlen_balanced_partitions_and_their_log():
    from rlpost.utils.seqlen_balancing import get_seqlen_balanced_partitions, log_seqlen_unbalance

    lengths = [9, 1, 8, 2, 7, 3]
    parts = get_seqlen_balanced_partitions(lengths, 2, equal_size=True)
    assert sorted(i for p in parts for i in p) == list(range(6)) and [len(p) for p in parts] == [3, 3]
    # greedy longest-first: 9 | 8, 7 -> 15 | 3, 2 fill the first (14), 1 the second (16)
    assert sorted(sum(lengths[i] for i in p) for p in parts) == [14, 16]
    assert len(get_seqlen_balanced_partitions(lengths, 4, equal_size=False)) == 4
    with pytest.raises(ValueError, match="6 rows do not split into 4 equal partitions"):
        get_seqlen_balanced_partitions(lengths, 4, equal_size=True)
    log = log_seqlen_unbalance(lengths, parts, "seqlen")
    # before: chunks [9, 1, 8] = 18 and [2, 7, 3] = 12; after: 14 and 16
    assert log == {"seqlen/min": 12, "seqlen/max": 18, "seqlen/minmax_diff": 6, "seqlen/balanced_min": 14,
                   "seqlen/balanced_max": 16, "seqlen/mean": 15.0}


def test_load_extern_type_from_a_file_or_a_module(tmp_path):
    from rlpost.utils.import_utils import UserCodeError, load_extern_type

    path = tmp_path / "my_sampler.py"
    path.write_text("class MySampler:\n    pass\n")
    assert load_extern_type(str(path), "MySampler").__name__ == "MySampler"
    assert load_extern_type("pkg://rlpost.utils.hdfs_io", "copy") is hdfs_io.copy
    assert load_extern_type("pkg://rlpost/utils/hdfs_io", "copy") is hdfs_io.copy  # verl's slash form
    assert load_extern_type("rlpost.utils.hdfs_io", "exists") is hdfs_io.exists
    assert load_extern_type(None, "anything") is None
    with pytest.raises(UserCodeError, match="load_extern_type.type_name: 'Nope' not found"):
        load_extern_type(str(path), "Nope")
    with pytest.raises(UserCodeError, match="'Nope' not found in module rlpost.utils.hdfs_io"):
        load_extern_type("rlpost.utils.hdfs_io", "Nope")


def test_small_verl_helpers():
    from rlpost.trainer.constants_ppo import get_ppo_ray_runtime_env
    from rlpost.utils.fs import copy_local_path_from_hdfs, copy_to_local
    from rlpost.utils.metric import reduce_metrics
    from rlpost.utils.py_functional import append_to_dict

    data = {"a": [1]}
    append_to_dict(data, {"a": 2, "b": 3})
    assert data == {"a": [1, 2], "b": [3]}
    assert reduce_metrics({"x": [1.0, 3.0], "y": 5}) == {"x": 2.0, "y": 5}
    assert copy_local_path_from_hdfs is copy_to_local
    env = get_ppo_ray_runtime_env()["env_vars"]
    assert env and all(isinstance(v, str) for v in env.values())


def test_update_model_config_recurses_into_sub_configs():
    from transformers import Qwen2Config

    from rlpost.utils.model import update_model_config

    cfg = Qwen2Config(hidden_size=64, num_attention_heads=2)
    cfg.text_config = Qwen2Config(hidden_size=32)
    update_model_config(cfg, {"rope_theta": 5.0, "text_config": {"hidden_size": 16}})
    assert cfg.rope_theta == 5.0 and cfg.text_config.hidden_size == 16 and cfg.hidden_size == 64
    with pytest.raises(AttributeError, match="has no 'vision_config'"):
        update_model_config(cfg, {"vision_config": {"depth": 2}})


def test_create_random_mask_shapes_and_bounds():
    from rlpost.utils.model import create_random_mask

    ids = torch.zeros(64, 20, dtype=torch.long)
    mask = create_random_mask(ids, max_ratio_of_valid_token=0.5, max_ratio_of_left_padding=0.25,
                              min_ratio_of_valid_token=0.2, generator=torch.Generator().manual_seed(0))
    assert mask.shape == (64, 20) and mask.dtype == torch.int64
    valid = mask.sum(-1)
    left = mask.argmax(-1)  # position of the first 1
    assert valid.min() >= 4 and valid.max() <= 10 and left.max() <= 5
    # the ones are one contiguous run: left padding, valid tokens, right padding
    assert all(mask[i, left[i]:left[i] + valid[i]].all() for i in range(64))
    with pytest.raises(ValueError, match="do not fit 20 tokens"):
        create_random_mask(ids, max_ratio_of_valid_token=0.9, max_ratio_of_left_padding=0.5)


def test_is_non_local():
    from rlpost.utils.fs import is_non_local

    assert is_non_local("hdfs://cluster/a") and not is_non_local("/data/a") and not is_non_local("relative/a")
