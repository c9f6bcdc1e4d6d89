"""Scorer of the synthetic arithmetic task (`rlpost/arith`, built by examples/data_preprocess/arith.py).

1.0 when the text after the last `####` is exactly the answer (surrounding spaces ignored), else
`format_score` (default 0.0) when a `#### <integer>` is present, else 0.0. Anything after the number
other than whitespace makes the answer wrong: the model must stop after answering.
"""

from __future__ import annotations

import re

_ANSWER = re.compile(r"^\s*(-?\d+)\s*$")


def compute_score(solution_str: str, ground_truth: str | int, format_score: float = 0.0) -> float:
    """Exact-match score of the integer after the last `####` in `solution_str`."""
    if "####" not in solution_str:
        return 0.0
    match = _ANSWER.match(solution_str.rsplit("####", 1)[1])
    if match is None:
        return 0.0
    return 1.0 if int(match.group(1)) == int(str(ground_truth).strip()) else format_score
