"""Fixtures for reward tests: a tokenizer and a builder of generated batches."""

import numpy as np
import pytest
import torch

from rlpost import keys
from rlpost.protocol import DataProto


@pytest.fixture(scope="session")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture
def make_batch(tokenizer):
    """make_batch(responses, ground_truths, data_sources=None, response_len=12) -> DataProto whose
    responses are right-padded to response_len and whose prompts are left-padded to 6 tokens."""

    def build(responses, ground_truths, data_sources=None, response_len=12, extra=None):
        n = len(responses)
        pad = tokenizer.pad_token_id
        prompt_ids = tokenizer("What is 1 + 2?", add_special_tokens=False)["input_ids"][-6:]
        prompts = torch.full((n, 6), pad, dtype=torch.long)
        prompts[:, 6 - len(prompt_ids):] = torch.tensor(prompt_ids)
        resp = torch.full((n, response_len), pad, dtype=torch.long)
        resp_mask = torch.zeros((n, response_len), dtype=torch.long)
        for i, text in enumerate(responses):
            ids = tokenizer(text, add_special_tokens=False)["input_ids"][:response_len]
            resp[i, : len(ids)] = torch.tensor(ids)
            resp_mask[i, : len(ids)] = 1
        prompt_mask = (prompts != pad).long()
        tensors = {
            keys.PROMPTS: prompts,
            keys.RESPONSES: resp,
            keys.RESPONSE_MASK: resp_mask,
            keys.ATTENTION_MASK: torch.cat([prompt_mask, resp_mask], dim=1),
            **(extra or {}),
        }
        sources = data_sources or ["rlpost/arith"] * n
        non_tensors = {
            keys.DATA_SOURCE: np.array(sources, dtype=object),
            keys.REWARD_MODEL: np.array([{"style": "rule", "ground_truth": g} for g in ground_truths], dtype=object),
            keys.EXTRA_INFO: np.array([{"index": i} for i in range(n)], dtype=object),
        }
        return DataProto.from_dict(tensors=tensors, non_tensors=non_tensors)

    return build
