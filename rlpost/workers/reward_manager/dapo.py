"""verl's module path of the `dapo` reward manager."""

from rlpost.reward.managers import DAPORewardManager

__all__ = ["DAPORewardManager"]
