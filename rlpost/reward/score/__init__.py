"""Built-in rule scorers, chosen by `data_source` (`default_compute_score`)."""

from __future__ import annotations

from typing import Any, Callable

from rlpost.reward.score import arith, gsm8k, math_boxed

ARITH_DATA_SOURCE = "rlpost/arith"


def _gsm8k(solution_str: str, ground_truth: Any, extra_info: Any) -> float:
    return gsm8k.compute_score(solution_str, ground_truth)


def _math(solution_str: str, ground_truth: Any, extra_info: Any) -> float:
    return math_boxed.compute_score(solution_str, ground_truth)


def _arith(solution_str: str, ground_truth: Any, extra_info: Any) -> float:
    return arith.compute_score(solution_str, ground_truth)


SCORERS: dict[str, Callable[[str, Any, Any], float]] = {
    "openai/gsm8k": _gsm8k,
    "lighteval/MATH": _math,
    "DigitalLearningGmbH/MATH-lighteval": _math,
    "HuggingFaceH4/MATH-500": _math,
    ARITH_DATA_SOURCE: _arith,
}


def default_compute_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None, **kwargs: Any
) -> float:
    """Score `solution_str` with the built-in scorer registered for `data_source`.

    Raises:
        NotImplementedError: no built-in scorer for `data_source` (the message lists the known ones).
    """
    scorer = SCORERS.get(data_source)
    if scorer is None:
        raise NotImplementedError(
            f"no built-in reward function for data_source={data_source!r}; known data sources: "
            f"{sorted(SCORERS)}. Set custom_reward_function.path to score other data."
        )
    return scorer(solution_str, ground_truth, extra_info)
