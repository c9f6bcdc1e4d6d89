"""Interactions: simulated users / graders that answer the model between turns of a rollout."""

from rlpost.interactions.base import BaseInteraction
from rlpost.interactions.utils.interaction_registry import (
    initialize_interactions_from_config,
    interactions_by_name,
)

__all__ = ["BaseInteraction", "initialize_interactions_from_config", "interactions_by_name"]
