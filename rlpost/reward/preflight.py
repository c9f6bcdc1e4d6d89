"""Check the reward function on a few validation samples before any worker starts."""

from __future__ import annotations

from typing import Any

from rlpost import keys
from rlpost.reward import base


def check_reward_fn(
    reward_fn: Any,
    dataset: Any,
    n: int = 4,
    reward_fn_key: str = keys.DATA_SOURCE,
) -> list[float]:
    """Score the first `n` rows of `dataset`, using each row's ground truth as the response text.

    The point is not the score but to fail early (before Ray and the models start) on an unknown
    data source, a function that raises, or a non-finite score.

    Args:
        reward_fn: a reward manager (from `load_reward_manager`; its own scoring path is used, so
            `batch`/`prime` functions are checked as they will be called) or a plain
            `compute_score(data_source, solution_str, ground_truth, extra_info=None)`.
        dataset: indexable; items are dicts with `reward_fn_key`, `reward_model`, `extra_info`.
        n: number of rows checked.

    Returns:
        The scores of the checked rows.

    Raises:
        RewardFunctionError: naming the data source and row.
    """
    samples = []
    for i in range(min(n, len(dataset))):
        row = dataset[i]
        ground_truth = (row.get(keys.REWARD_MODEL) or {}).get("ground_truth")
        samples.append(base.Sample(
            index=i,
            data_source=row.get(getattr(reward_fn, "reward_fn_key", reward_fn_key)),
            prompt_str="",
            # Satisfies the built-in scorers' formats (boxed, ####); only errors matter here.
            response_str=f"\\boxed{{{ground_truth}}}\n#### {ground_truth}",
            ground_truth=ground_truth,
            extra_info=row.get(keys.EXTRA_INFO),
            valid_response_length=0,
        ))
    if hasattr(reward_fn, "score_samples"):
        results = reward_fn.score_samples(samples)
    else:
        results = [base.call_reward_fn(reward_fn, s) for s in samples]
    return [base.split_result(r, s)[0] for r, s in zip(results, samples)]
