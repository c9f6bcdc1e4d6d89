"""verl's module path of the `batch` reward manager."""

from rlpost.reward.managers import BatchRewardManager

__all__ = ["BatchRewardManager"]
