"""verl import-path alias: `from rlpost.workers.reward_manager import NaiveRewardManager, register, ...`.

The managers live in `rlpost.reward`; this package re-exports them under verl's names and module paths
(`.abstract`, `.registry`, `.naive`, `.dapo`, `.batch`, `.prime`).
"""

from rlpost.reward.managers import AbstractRewardManager, BatchRewardManager, DAPORewardManager, NaiveRewardManager
from rlpost.reward.prime import PrimeRewardManager
from rlpost.workers.reward_manager.registry import REWARD_MANAGER_REGISTRY, get_reward_manager_cls, register

__all__ = ["REWARD_MANAGER_REGISTRY", "AbstractRewardManager", "BatchRewardManager", "DAPORewardManager",
           "NaiveRewardManager", "PrimeRewardManager", "get_reward_manager_cls", "register"]
