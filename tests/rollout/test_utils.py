"""Pure rollout helpers: sampling resolution, masks, output assembly (no engine)."""

import numpy as np
import torch

from _compose import SMALL, compose_config, typed_config_of
from rlpost import keys
from rlpost.protocol import DataProto
from rlpost.rollout.base import resolve_sampling
from rlpost.rollout.utils import assemble_output, eos_id_set, prompt_token_lists, response_mask_from

# The rollout group of the default config with a few sampling overrides; val_kwargs keep their (greedy) defaults.
SAMPLING = ("actor_rollout_ref.rollout.name=hf", "actor_rollout_ref.rollout.temperature=0.7",
            "actor_rollout_ref.rollout.top_k=20", "actor_rollout_ref.rollout.top_p=0.9", "data.max_response_length=4",
            "actor_rollout_ref.rollout.calculate_log_probs=true")


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
    cfg = typed_config_of(*SMALL, *SAMPLING).actor_rollout_ref.rollout
    assert resolve_sampling(compose_config(*SMALL, *SAMPLING).actor_rollout_ref.rollout, {}) == resolve_sampling(cfg, {})
    train = resolve_sampling(cfg, {})
    assert (train.greedy, train.temperature, train.top_k, train.top_p, train.max_tokens) == (False, 0.7, 20, 0.9, 4)
    assert train.logprobs is True and train.ignore_eos is False
    val = resolve_sampling(cfg, {keys.META_VALIDATE: True})
    assert val.greedy and val.temperature == 0.0 and val.top_k == -1
    assert resolve_sampling(cfg, {keys.META_DO_SAMPLE: False}).greedy
    assert resolve_sampling(cfg, {keys.META_TEMPERATURE: 1.3}).temperature == 1.3
    assert resolve_sampling(cfg, {keys.META_TEMPERATURE: 0.0}).greedy  # temperature 0 decodes greedily


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


def test_row_caps_walk_each_group_and_stop_at_the_response_length():
    from rlpost.rollout.utils import row_caps

    data = DataProto.from_dict(tensors={keys.INPUT_IDS: torch.zeros(5, 2, dtype=torch.long)},
                               non_tensors={keys.UID: np.array(["a", "a", "a", "b", "b"], dtype=object),
                                            keys.RESPONSE_CAPS: np.array([[4, 9]] * 3 + [[30, 2]] * 2, dtype=object)})
    assert row_caps(data, max_tokens=8) == [4, 8, 4, 8, 2]  # a's caps wrap around; 9 and 30 stop at 8
    assert row_caps(DataProto.from_dict(tensors={keys.INPUT_IDS: torch.zeros(1, 2)}), 8) is None
