"""verl import-path alias: `rlpost.utils.reward_score` (the scorers live in `rlpost.reward.score`).

    from rlpost.utils.reward_score import default_compute_score
    from rlpost.utils.reward_score import gsm8k, math   # gsm8k.compute_score, math.compute_score
"""

from rlpost.reward.score import default_compute_score
from rlpost.utils.reward_score import gsm8k, math

# Older verl recipes import the function under its private name.
_default_compute_score = default_compute_score

__all__ = ["default_compute_score", "gsm8k", "math"]
