"""A reward manager written against verl's API: `reward.reward_manager.source=importlib` loads it from this file.

    python -m rlpost.trainer.main_ppo ... reward.reward_manager.source=importlib \
        reward.reward_manager.module.path=examples/reward_manager/offset_reward_manager.py \
        reward.reward_manager.module.name=OffsetRewardManager +reward_model.reward_kwargs.offset=0.5

It scores each response with the run's reward function (`compute_score`: `custom_reward_function`, else the
built-in scorer of the row's data source) and adds `offset` (from `reward_model.reward_kwargs`); the same file
runs in verl with its imports saying `verl`.
"""

from collections import defaultdict

import torch

from rlpost import DataProto
from rlpost.workers.reward_manager.abstract import AbstractRewardManager


class OffsetRewardManager(AbstractRewardManager):
    def __init__(self, tokenizer, num_examine, compute_score=None, reward_fn_key="data_source", offset=0.0,
                 **kwargs):
        self.tokenizer = tokenizer
        self.num_examine = num_examine
        self.compute_score = compute_score
        self.reward_fn_key = reward_fn_key
        self.offset = float(offset)

    def __call__(self, data: DataProto, return_dict: bool = False):
        if "rm_scores" in data.batch.keys():
            return {"reward_tensor": data.batch["rm_scores"]} if return_dict else data.batch["rm_scores"]
        reward_tensor = torch.zeros_like(data.batch["responses"], dtype=torch.float32)
        extra = defaultdict(list)
        prompt_length = data.batch["prompts"].shape[-1]
        for i in range(len(data)):
            item = data[i]
            valid_length = int(item.batch["attention_mask"][prompt_length:].sum())
            response = self.tokenizer.decode(item.batch["responses"][:valid_length], skip_special_tokens=True)
            score = self.compute_score(
                data_source=item.non_tensor_batch[self.reward_fn_key],
                solution_str=response,
                ground_truth=item.non_tensor_batch["reward_model"]["ground_truth"],
                extra_info=item.non_tensor_batch.get("extra_info", None),
            )
            score = float(score["score"] if isinstance(score, dict) else score)
            reward_tensor[i, max(valid_length - 1, 0)] = score + self.offset
            extra["base_score"].append(score)
        if return_dict:
            return {"reward_tensor": reward_tensor, "reward_extra_info": dict(extra)}
        return reward_tensor
