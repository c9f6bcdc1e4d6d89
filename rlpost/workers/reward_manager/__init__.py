"""verl import-path alias: `from rlpost.workers.reward_manager import NaiveRewardManager, register, ...`.

The managers live in `rlpost.reward`; this package re-exports them under verl's names.
"""

from typing import Any, Callable

from rlpost.reward.managers import REWARD_MANAGERS, BatchRewardManager, DAPORewardManager, NaiveRewardManager
from rlpost.reward.prime import PrimeRewardManager


def register(name: str) -> Callable[[type], type]:
    """Decorator registering a reward manager class under `name` (`reward_model.reward_manager=name`)."""
    return REWARD_MANAGERS.register(name)


def get_reward_manager_cls(name: str) -> Any:
    """The reward manager class registered under `name`; a ValueError lists the valid names otherwise."""
    return REWARD_MANAGERS.get(name)


__all__ = ["BatchRewardManager", "DAPORewardManager", "NaiveRewardManager", "PrimeRewardManager",
           "get_reward_manager_cls", "register"]
