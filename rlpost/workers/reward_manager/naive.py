"""verl's module path of the `naive` reward manager."""

from rlpost.reward.managers import NaiveRewardManager

__all__ = ["NaiveRewardManager"]
