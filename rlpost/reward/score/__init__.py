"""Built-in rule scorers, chosen by `data_source` (`default_compute_score`)."""

from __future__ import annotations

from typing import Any, Callable

from rlpost.reward.score import arith, colour, geo3k, gsm8k, math_boxed

ARITH_DATA_SOURCE = "rlpost/arith"
# Code data sources scored by running the response in the sandbox (`reward_model.sandbox_fusion.url`);
# rlpost/code is the quick-start task's.
CODE_DATA_SOURCES = ("codecontests", "apps", "codeforces", "taco", "prime_code", "livecodebench", "rlpost/code")


def _gsm8k(solution_str: str, ground_truth: Any, extra_info: Any) -> float:
    return gsm8k.compute_score(solution_str, ground_truth)


def _math(solution_str: str, ground_truth: Any, extra_info: Any) -> float:
    return math_boxed.compute_score(solution_str, ground_truth)


def _geo3k(solution_str: str, ground_truth: Any, extra_info: Any) -> float:
    return geo3k.compute_score(solution_str, ground_truth)


def _arith(solution_str: str, ground_truth: Any, extra_info: Any) -> float:
    return arith.compute_score(solution_str, ground_truth)


def _colour(solution_str: str, ground_truth: Any, extra_info: Any) -> float:
    return colour.compute_score(solution_str, ground_truth)


SCORERS: dict[str, Callable[[str, Any, Any], float]] = {
    "openai/gsm8k": _gsm8k,
    "lighteval/MATH": _math,
    "DigitalLearningGmbH/MATH-lighteval": _math,
    "HuggingFaceH4/MATH-500": _math,
    ARITH_DATA_SOURCE: _arith,
    geo3k.DATA_SOURCE: _geo3k,
    **{source: _colour for source in colour.DATA_SOURCES},
}


def default_compute_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None,
    sandbox_fusion_url: str | None = None, concurrent_semaphore: Any = None, memory_limit_mb: int | None = None, *,
    use_tool_bonus: bool = False, tool_bonus: float = 0.0, multi_tool_penalty: float = 0.0, **code_kwargs: Any,
) -> float | dict:
    """Score `solution_str` with the built-in scorer registered for `data_source`, shaped for tool use
    (`custom_reward_function.reward_kwargs`) in multi-turn rollouts, where `extra_info["tool_calls"]` is the
    trajectory's number of tool calls. Code data sources (`CODE_DATA_SOURCES`) run in the sandbox at
    `sandbox_fusion_url` (`rlpost.reward.score.code.compute_score`, `code_kwargs` such as `timeout`, `continuous`,
    `max_cases` from `reward.compute_score_kwargs`) and return a dict with the score and its sandbox details.

        score + tool_bonus   when use_tool_bonus, the answer is right (score > 0) and a tool was called
              - multi_tool_penalty * (tool_calls - 1)   for every call beyond the first

    Raises:
        NotImplementedError: no built-in scorer for `data_source` (the message lists the known ones).
    """
    if data_source in CODE_DATA_SOURCES:
        return _code(data_source, solution_str, ground_truth, sandbox_fusion_url, concurrent_semaphore,
                     memory_limit_mb, code_kwargs)
    if code_kwargs:
        raise TypeError(f"reward.compute_score_kwargs {sorted(code_kwargs)} apply to code data sources only "
                        f"({', '.join(CODE_DATA_SOURCES)}), not to data_source={data_source!r}")
    scorer = SCORERS.get(data_source)
    if scorer is None:
        raise NotImplementedError(
            f"no built-in reward function for data_source={data_source!r}; known data sources: "
            f"{sorted(SCORERS) + list(CODE_DATA_SOURCES)}. Set custom_reward_function.path to score other data."
        )
    score = scorer(solution_str, ground_truth, extra_info)
    tool_calls = int((extra_info or {}).get("tool_calls", 0)) if isinstance(extra_info, dict) else 0
    if use_tool_bonus and score > 0 and tool_calls > 0:
        score += float(tool_bonus)
    return score - float(multi_tool_penalty) * max(tool_calls - 1, 0)


def _code(data_source: str, solution_str: str, ground_truth: Any, url: str | None, slots: Any,
          memory_limit_mb: int | None, kwargs: dict) -> dict:
    if not url:
        raise ValueError(f"data_source={data_source!r} is scored by running the program: set "
                         "reward_model.sandbox_fusion.url (local starts rlpost's sandbox with the run)")
    from rlpost.reward.score import code

    return code.compute_score(url, solution_str, ground_truth, memory_limit_mb=memory_limit_mb or 1024,
                              concurrent_semaphore=slots, **kwargs)
