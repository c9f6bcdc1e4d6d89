"""Scorer of the synthetic colour task (`rlpost/colour` and its blanked control `rlpost/colour_blank`, built by
examples/data_preprocess/vision_colour.py).

1.0 when the text after the last `####` is exactly the colour name (case and surrounding spaces ignored), else
0.0; anything else after the name makes the answer wrong: the model must stop after answering.
"""

from __future__ import annotations

DATA_SOURCES = ("rlpost/colour", "rlpost/colour_blank")


def compute_score(solution_str: str, ground_truth: str) -> float:
    """Exact-match score of the word after the last `####` in `solution_str`."""
    if "####" not in solution_str:
        return 0.0
    answer = solution_str.rsplit("####", 1)[1].strip().lower()
    return 1.0 if answer == str(ground_truth).strip().lower() else 0.0
