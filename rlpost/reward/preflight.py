"""Check the reward function on a few validation samples before any worker starts."""

from __future__ import annotations

from typing import Any, Callable

from rlpost import keys
from rlpost.reward import base


def check_reward_fn(
    compute_score: Callable[..., Any],
    dataset: Any,
    n: int = 4,
    reward_fn_key: str = keys.DATA_SOURCE,
) -> list[float]:
    """Score the first `n` rows of `dataset`, using each row's ground truth as the response text.

    The point is not the score but to fail early (before Ray and the models start) on an unknown
    data source, a function that raises, or a non-finite score.

    Args:
        compute_score: `compute_score(data_source, solution_str, ground_truth, extra_info=None)`
            (e.g. `RewardFnSpec.resolve()`).
        dataset: indexable; items are dicts with `reward_fn_key`, `reward_model`, `extra_info`.
        n: number of rows checked.

    Returns:
        The scores of the checked rows.

    Raises:
        RewardFunctionError: naming the data source and row.
    """
    scores = []
    for i in range(min(n, len(dataset))):
        row = dataset[i]
        ground_truth = (row.get(keys.REWARD_MODEL) or {}).get("ground_truth")
        sample = base.Sample(
            index=i,
            data_source=row.get(reward_fn_key),
            prompt_str="",
            response_str=f"\\boxed{{{ground_truth}}}\n#### {ground_truth}",
            ground_truth=ground_truth,
            extra_info=row.get(keys.EXTRA_INFO),
            valid_response_length=0,
        )
        score, _ = base.split_result(base.call_reward_fn(compute_score, sample), sample)
        scores.append(score)
    return scores
