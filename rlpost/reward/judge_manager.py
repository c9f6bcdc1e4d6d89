"""The reward manager of a generative reward model: each batch's samples go to the judge concurrently, through
the built-in judge scorer (`reward_model.judge.enable`) or a custom reward function in verl's reward loop."""

from __future__ import annotations

from typing import Any

from rlpost import keys
from rlpost.reward import base
from rlpost.reward.custom import RewardFnSpec
from rlpost.reward.judge import JudgeEndpoint, run_reward_loop, score_with_judge
from rlpost.reward.managers import NaiveRewardManager


class JudgeRewardManager(NaiveRewardManager):
    """The naive manager whose samples are scored by the judge at `endpoint`: with `judge.enable` every sample by
    the built-in scorer (results `{"score", judge_parse_failed, judge_latency_s}`), else by the custom function
    `spec` with `reward_router_address` / `reward_model_tokenizer` passed when it takes them."""

    def __init__(self, tokenizer: Any, num_examine: int, spec: RewardFnSpec, judge: Any, endpoint: JudgeEndpoint,
                 judge_tokenizer: Any = None, reward_fn_key: str = keys.DATA_SOURCE) -> None:
        super().__init__(tokenizer, num_examine, spec, reward_fn_key)
        self.judge, self.endpoint, self.judge_tokenizer = judge, endpoint, judge_tokenizer

    def score_samples(self, samples: list[base.Sample]) -> list[Any]:
        """Raw results of the judge (or the reward-loop function), one per sample, in order."""
        if self.judge.enable:
            return score_with_judge(self.judge, self.endpoint, samples)
        return run_reward_loop(self.compute_score, samples, self.endpoint, self.judge_tokenizer,
                               self.judge.max_concurrency)


def judge_reward_manager(config: Any, tokenizer: Any, num_examine: int) -> JudgeRewardManager:
    """The manager of `config`'s generative reward model, its endpoint empty until the judge's pool has started
    (`rlpost.workers.judge_server.start_judge`) unless `judge.url` is set. A reward-loop function gets the judge's
    tokenizer (verl's `reward_model_tokenizer`), loaded from `reward_model.model.path` when rlpost serves it."""
    from rlpost.reward.custom import reward_fn_spec

    judge, judge_tokenizer = config.reward_model.judge, None
    endpoint = JudgeEndpoint(judge.url, judge_model_name(config))
    if judge.url is None and not judge.enable:
        import os

        from transformers import AutoTokenizer

        path = os.path.expanduser(str(config.reward_model.model.path))
        trust = config.reward_model.model.trust_remote_code
        judge_tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust)
    return JudgeRewardManager(tokenizer, num_examine, reward_fn_spec(config), judge, endpoint, judge_tokenizer,
                              reward_fn_key=config.data.reward_fn_key)


def judge_model_name(config: Any) -> str:
    """The model name each request carries: `judge.model_name`, else the served folder (vLLM's default name)."""
    judge = config.reward_model.judge
    if judge.model_name:
        return judge.model_name
    import os

    return os.path.expanduser(str(config.reward_model.model.path))
