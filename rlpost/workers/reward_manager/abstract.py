"""verl's `AbstractRewardManager` path: `from rlpost.workers.reward_manager.abstract import AbstractRewardManager`."""

from rlpost.reward.managers import AbstractRewardManager

__all__ = ["AbstractRewardManager"]
