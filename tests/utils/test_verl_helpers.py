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
