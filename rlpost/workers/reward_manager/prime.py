"""verl's module path of the `prime` reward manager."""

from rlpost.reward.prime import PrimeRewardManager

__all__ = ["PrimeRewardManager"]
