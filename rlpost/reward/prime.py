"""`prime` reward manager: score every sample in parallel worker processes, with a time-out per sample
(see `rlpost.reward.parallel`). For reward functions that are slow or may hang (code execution,
symbolic math)."""

from __future__ import annotations

from typing import Any, Callable

from rlpost import keys
from rlpost.reward import base
from rlpost.reward.custom import RewardFnSpec
from rlpost.reward.managers import DEFAULT_SAMPLE_TIMEOUT_S, REWARD_MANAGERS, NaiveRewardManager
from rlpost.reward.parallel import score_in_processes


@REWARD_MANAGERS.register("prime")
class PrimeRewardManager(NaiveRewardManager):
    """Parallel scoring in a process pool of `num_processes` workers (default: CPU count, at most 64)
    and `timeout` seconds per sample."""

    def __init__(self, tokenizer: Any, num_examine: int, spec: RewardFnSpec | Callable | None = None,
                 reward_fn_key: str = keys.DATA_SOURCE, num_processes: int | None = None,
                 timeout: float = DEFAULT_SAMPLE_TIMEOUT_S, compute_score: Callable | None = None):
        super().__init__(tokenizer, num_examine, spec, reward_fn_key, num_processes=num_processes, timeout=timeout,
                         compute_score=compute_score)
        if self.spec is None:
            raise ValueError("the prime manager rebuilds the reward function in worker processes from where it is "
                             "defined: give it as custom_reward_function.path/name (a RewardFnSpec), not a function")

    def score_samples(self, samples: list[base.Sample]) -> list[Any]:
        return score_in_processes(self.spec, samples, self.num_processes, self.timeout)
