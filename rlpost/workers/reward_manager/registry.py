"""verl's reward-manager registry module: `register(name)`, `get_reward_manager_cls(name)` and
`REWARD_MANAGER_REGISTRY`, the live name -> class dict of rlpost's registry (an entry added to it is registered)."""

from typing import Any, Callable

from rlpost.reward.managers import REWARD_MANAGERS

REWARD_MANAGER_REGISTRY = REWARD_MANAGERS.mapping()


def register(name: str) -> Callable[[type], type]:
    """Decorator registering a reward manager class under `name` (`reward_model.reward_manager=name`)."""
    return REWARD_MANAGERS.register(name)


def get_reward_manager_cls(name: str) -> Any:
    """The reward manager class registered under `name`; a ValueError lists the valid names otherwise."""
    return REWARD_MANAGERS.get(name)


__all__ = ["REWARD_MANAGER_REGISTRY", "get_reward_manager_cls", "register"]
