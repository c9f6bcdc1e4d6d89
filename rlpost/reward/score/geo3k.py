"""Geometry3K scorer (verl's `hiyouga/geometry3k` data source, e.g. Qwen2.5-VL GRPO on geo3k).

Score = (1 - format_score) * accuracy + format_score * format, where accuracy is 1 when the last `\\boxed{...}`
of the response normalises to the ground truth (`math_boxed.normalize_answer`) and format is 1 when the whole
response reads `<think>...</think> ... \\boxed{...} ...`. With the default format_score 0.1: a right boxed answer
without the think block scores 0.9, a well-formed wrong one 0.1. Answers are compared as normalised strings:
unlike verl's `mathruler` grader there is no symbolic equivalence (`\frac{60}{2}` is not `30`).
"""

from __future__ import annotations

import re

from rlpost.reward.score.math_boxed import last_boxed_content, normalize_answer

DATA_SOURCE = "hiyouga/geometry3k"
_FORMAT = re.compile(r"<think>.*</think>.*\\boxed\{.*\}.*", re.DOTALL)


def format_reward(solution_str: str) -> float:
    """1.0 when the response is a think block followed by a boxed answer, else 0.0."""
    return 1.0 if _FORMAT.fullmatch(solution_str) else 0.0


def acc_reward(solution_str: str, ground_truth: str, use_boxed: bool = True) -> float:
    """1.0 when the (last boxed, or with `use_boxed=False` the whole) answer equals the ground truth."""
    answer = last_boxed_content(solution_str) if use_boxed else solution_str
    if answer is None:
        return 0.0
    reference = last_boxed_content(ground_truth) or ground_truth
    return 1.0 if normalize_answer(answer) == normalize_answer(reference) else 0.0


def compute_score(solution_str: str, ground_truth: str, use_boxed: bool = True, format_score: float = 0.1) -> float:
    """(1 - format_score) * accuracy + format_score * format, in [0, 1]."""
    return (1.0 - format_score) * acc_reward(solution_str, ground_truth, use_boxed) + \
        format_score * format_reward(solution_str)
