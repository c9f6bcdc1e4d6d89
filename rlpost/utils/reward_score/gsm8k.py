"""verl import-path alias of the GSM8K scorer (`rlpost.reward.score.gsm8k`)."""

from rlpost.reward.score.gsm8k import compute_score, extract_solution

__all__ = ["compute_score", "extract_solution"]
