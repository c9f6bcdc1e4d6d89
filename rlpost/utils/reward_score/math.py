"""verl import-path alias of the boxed-answer MATH scorer (`rlpost.reward.score.math_boxed`)."""

from rlpost.reward.score.math_boxed import compute_score, last_boxed_content, normalize_answer

__all__ = ["compute_score", "last_boxed_content", "normalize_answer"]
