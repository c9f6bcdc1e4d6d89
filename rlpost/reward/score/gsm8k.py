"""GSM8K scorer: the final answer follows `####`.

`strict` reads only the last `#### <number>`; `flexible` takes the last number anywhere in the text.
Commas and a trailing period are dropped before comparing with the ground truth.
"""

from __future__ import annotations

import re

_STRICT = re.compile(r"####\s*(-?[0-9][0-9,]*(?:\.[0-9]+)?)")
_NUMBER = re.compile(r"-?[0-9][0-9,]*(?:\.[0-9]+)?")
# Only the tail is searched: a runaway response must not make scoring quadratic or slow.
_TAIL_CHARS = 300


def _clean(number: str) -> str:
    return number.replace(",", "").rstrip(".")


def extract_solution(solution_str: str, method: str = "strict") -> str | None:
    """Return the final answer of `solution_str` as a string without commas, or None if absent.

    Args:
        solution_str: decoded response text.
        method: `strict` (needs `#### <number>`) or `flexible` (last number in the text).
    """
    if method not in ("strict", "flexible"):
        raise ValueError(f"gsm8k: method must be 'strict' or 'flexible', got {method!r}")
    tail = solution_str[-_TAIL_CHARS:]
    pattern = _STRICT if method == "strict" else _NUMBER
    matches = pattern.findall(tail)
    return _clean(matches[-1]) if matches else None


def compute_score(
    solution_str: str,
    ground_truth: str,
    method: str = "strict",
    format_score: float = 0.0,
    score: float = 1.0,
) -> float:
    """`score` when the extracted answer equals `ground_truth`, `format_score` when an answer was found
    but is wrong, 0.0 when no answer was found."""
    answer = extract_solution(solution_str, method)
    if answer is None:
        return 0.0
    return score if answer == _clean(str(ground_truth).strip()) else format_score
