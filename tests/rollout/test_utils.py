"""Pure rollout helpers: sampling resolution, masks, output assembly (no engine)."""

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from rlpost import keys
from rlpost.protocol import DataProto
from rlpost.rollout.base import check_unsupported, resolve_sampling
from rlpost.rollout.utils import assemble_output, eos_id_set, prompt_token_lists, response_mask_from

CFG = OmegaConf.create(
    dict(
        temperature=0.7, top_k=20, top_p=0.9, do_sample=True, response_length=4, ignore_eos=False,
        calculate_log_probs=True, val_kwargs=dict(temperature=0, top_k=-1, top_p=1.0, do_sample=False, n=1),
    )
)


def _prompts() -> DataProto:
    # rows: [pad, 5, 6] and [7, 8, 9]; pad id 0
    ids = torch.tensor([[0, 5, 6], [7, 8, 9]])
    mask = torch.tensor([[0, 1, 1], [1, 1, 1]])
    pos = torch.tensor([[0, 0, 1], [0, 1, 2]])
    return DataProto.from_dict(
        tensors={keys.INPUT_IDS: ids, keys.ATTENTION_MASK: mask, keys.POSITION_IDS: pos},
        non_tensors={keys.UID: np.array(["a", "b"], dtype=object)},
        meta_info={keys.META_EOS_TOKEN_ID: 2, keys.META_PAD_TOKEN_ID: 0},
    )


def test_resolve_sampling_train_val_and_overrides():
    train = resolve_sampling(CFG, {})
    assert (train.greedy, train.temperature, train.top_k, train.top_p, train.max_tokens) == (False, 0.7, 20, 0.9, 4)
    assert train.logprobs is True
    val = resolve_sampling(CFG, {keys.META_VALIDATE: True})
    assert val.greedy and val.temperature == 0.0 and val.top_k == -1
    assert resolve_sampling(CFG, {keys.META_DO_SAMPLE: False}).greedy
    assert resolve_sampling(CFG, {keys.META_TEMPERATURE: 1.3}).temperature == 1.3
    with pytest.raises(ValueError, match="response_length"):
        resolve_sampling(OmegaConf.create({"temperature": 1.0}), {})


def test_unsupported_options_raise():
    with pytest.raises(NotImplementedError, match="not supported yet: .*use_fire_sampling"):
        check_unsupported(OmegaConf.create({"use_fire_sampling": True}))
    with pytest.raises(NotImplementedError, match="multi_turn.enable"):
        check_unsupported(OmegaConf.create({"multi_turn": {"enable": True}}))
    check_unsupported(OmegaConf.create({"use_fire_sampling": False, "multi_turn": {"enable": False}}))


def test_response_mask_stops_after_first_eos():
    responses = torch.tensor([[4, 2, 4, 2], [4, 4, 0, 0], [2, 0, 0, 0]])
    lengths = torch.tensor([4, 2, 1])
    mask = response_mask_from(responses, lengths, {2})
    assert mask.tolist() == [[1, 1, 0, 0], [1, 1, 0, 0], [1, 0, 0, 0]]
    assert eos_id_set([2, 3]) == {2, 3} and eos_id_set(5) == {5} and eos_id_set(None) == set()


def test_prompt_token_lists_strip_left_padding_or_use_raw_ids():
    data = _prompts()
    assert prompt_token_lists(data) == [[5, 6], [7, 8, 9]]
    data.non_tensor_batch[keys.RAW_PROMPT_IDS] = np.array([[1], [2, 3]], dtype=object)
    assert prompt_token_lists(data) == [[1], [2, 3]]


def test_assemble_output_hand_example():
    out = assemble_output(_prompts(), [[4, 2], [4, 4, 4, 4, 4]], response_length=4, log_probs=[[-0.5, -1.0], [-0.1] * 5])
    assert out.batch[keys.RESPONSES].tolist() == [[4, 2, 0, 0], [4, 4, 4, 4]]
    assert out.batch[keys.RESPONSE_MASK].tolist() == [[1, 1, 0, 0], [1, 1, 1, 1]]
    assert out.batch[keys.INPUT_IDS].tolist() == [[0, 5, 6, 4, 2, 0, 0], [7, 8, 9, 4, 4, 4, 4]]
    assert out.batch[keys.ATTENTION_MASK].tolist() == [[0, 1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1, 1]]
    assert out.batch[keys.POSITION_IDS].tolist() == [[0, 0, 1, 2, 3, 4, 5], [0, 1, 2, 3, 4, 5, 6]]
    assert out.batch[keys.PROMPTS].tolist() == [[0, 5, 6], [7, 8, 9]]
    assert torch.allclose(out.batch[keys.ROLLOUT_LOG_PROBS], torch.tensor([[-0.5, -1.0, 0, 0], [-0.1] * 4]))
    assert list(out.non_tensor_batch[keys.UID]) == ["a", "b"]
    assert out.meta_info[keys.META_EOS_TOKEN_ID] == 2
