"""`BaseInteraction`: a simulated user (or grader) that answers the model between turns.

verl's method names and returns. One interaction object serves many trajectories at once; each
trajectory is an *instance* (`start_interaction` -> `generate_response`* -> `finalize_interaction`)
keyed by `instance_id`. The sample picks the interaction by `extra_info.interaction_kwargs.name`; the
other `interaction_kwargs` are passed to `start_interaction` and `generate_response`.
"""

from __future__ import annotations

from typing import Any
from uuid import uuid4


class BaseInteraction:
    """Base class of interactions.

    Args:
        config: the entry's `config` mapping from the interaction YAML; the loader adds `name`.
    """

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = dict(config or {})
        self.name: str = self.config.get("name", "interaction_agent")

    async def start_interaction(self, instance_id: str | None = None, **kwargs: Any) -> str:
        """Open an instance for one trajectory; returns its id (a fresh uuid when None)."""
        return instance_id if instance_id is not None else str(uuid4())

    async def generate_response(
        self, instance_id: str, messages: list[dict[str, Any]], **kwargs: Any
    ) -> tuple[bool, str, float, dict[str, Any]]:
        """Answer the conversation so far (its last message is the model's).

        Returns:
            (should_terminate, text, score, extra): `text` becomes the next user message unless
            `should_terminate`; `score` is this turn's score.
        """
        return False, "Your current result seems acceptable.", 0.0, {}

    async def calculate_score(self, instance_id: str, **kwargs: Any) -> float:
        """Score of the instance's current state."""
        return 0.0

    async def finalize_interaction(self, instance_id: str, **kwargs: Any) -> None:
        """Drop the instance's state."""
