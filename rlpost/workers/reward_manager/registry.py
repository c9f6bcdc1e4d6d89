"""verl's reward-manager registry module: `register(name)` and `get_reward_manager_cls(name)`."""

from typing import Any, Callable

from rlpost.reward.managers import REWARD_MANAGERS


def register(name: str) -> Callable[[type], type]:
    """Decorator registering a reward manager class under `name` (`reward_model.reward_manager=name`)."""
    return REWARD_MANAGERS.register(name)


def get_reward_manager_cls(name: str) -> Any:
    """The reward manager class registered under `name`; a ValueError lists the valid names otherwise."""
    return REWARD_MANAGERS.get(name)


__all__ = ["get_reward_manager_cls", "register"]
