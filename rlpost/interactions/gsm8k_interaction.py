"""`Gsm8kInteraction`: grades the model's last answer; when it is wrong, says so and lets it retry.

Scores as verl's: flexible GSM8K score of the last assistant message (1.0 right, 0.0 otherwise). The
conversation ends when the answer is right; otherwise the model gets another turn (bounded by
`multi_turn.max_user_turns` / `max_assistant_turns` and the response budget).
"""

from __future__ import annotations

from typing import Any
from uuid import uuid4

from rlpost.interactions.base import BaseInteraction
from rlpost.reward.score import gsm8k

CORRECT = "Your response is correct!"
INCORRECT = "Your response is incorrect! You need to reflect on your answer and try again."


def last_assistant_text(messages: list[dict[str, Any]]) -> str:
    """Content of the last assistant message, "" when there is none."""
    for message in reversed(messages):
        if message.get("role") == "assistant":
            return str(message.get("content") or "")
    return ""


class Gsm8kInteraction(BaseInteraction):
    """Needs `ground_truth` in the sample's `interaction_kwargs`."""

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        self._instances: dict[str, dict[str, Any]] = {}

    async def start_interaction(
        self, instance_id: str | None = None, ground_truth: str | None = None, **kwargs: Any
    ) -> str:
        instance_id = instance_id if instance_id is not None else str(uuid4())
        self._instances[instance_id] = {"response": "", "ground_truth": ground_truth, "reward": 0.0}
        return instance_id

    async def generate_response(
        self, instance_id: str, messages: list[dict[str, Any]], **kwargs: Any
    ) -> tuple[bool, str, float, dict[str, Any]]:
        content = last_assistant_text(messages)
        state = self._instances[instance_id]
        state["response"] = content if content.startswith("#### ") else "#### " + content
        reward = await self.calculate_score(instance_id)
        state["reward"] = reward
        if reward == 1.0:
            return True, CORRECT, reward, {}
        return False, INCORRECT, reward, {}

    async def calculate_score(self, instance_id: str, **kwargs: Any) -> float:
        state = self._instances[instance_id]
        if state["ground_truth"] is None:
            return 0.0
        return gsm8k.compute_score(
            state["response"], str(state["ground_truth"]), method="flexible", format_score=0.0, score=1.0
        )

    async def finalize_interaction(self, instance_id: str, **kwargs: Any) -> None:
        self._instances.pop(instance_id, None)
