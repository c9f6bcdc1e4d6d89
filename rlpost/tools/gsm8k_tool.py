"""`Gsm8kTool`: the model submits its GSM8K answer and gets back whether it is right.

Rewards as verl's: the instance's reward is the flexible GSM8K score of the last submission (1.0 right,
0.0 otherwise); each call's step reward is 0.0 when the submission raised the reward and -0.05 when it
did not (discourages resubmitting the same or a worse answer).
"""

from __future__ import annotations

from typing import Any
from uuid import uuid4

from rlpost.reward.score import gsm8k
from rlpost.tools.base_tool import BaseTool, create_kwarg, parameters_as_dict
from rlpost.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

NO_IMPROVEMENT_PENALTY = -0.05

DEFAULT_SCHEMA = {
    "type": "function",
    "function": {
        "name": "calc_gsm8k_reward",
        "description": "Check your answer to the GSM8K problem (1.0 if it is correct, 0.0 if it is not).",
        "parameters": {
            "type": "object",
            "properties": {"answer": {"type": "string", "description": "The final answer, digits only."}},
            "required": ["answer"],
        },
    },
}


class Gsm8kTool(BaseTool):
    """Scores a submitted `answer` against the `ground_truth` given at `create` time (through the sample's
    `tools_kwargs: {calc_gsm8k_reward: {create_kwargs: {ground_truth: ...}}}`)."""

    def __init__(self, config: dict[str, Any], tool_schema: OpenAIFunctionToolSchema | dict | None = None) -> None:
        super().__init__(config, tool_schema)
        self._instances: dict[str, dict[str, Any]] = {}

    def get_openai_tool_schema(self) -> OpenAIFunctionToolSchema:
        return self.tool_schema or OpenAIFunctionToolSchema.model_validate(DEFAULT_SCHEMA)

    async def create(
        self, instance_id: str | None = None, ground_truth: str | None = None, **kwargs: Any
    ) -> tuple[str, ToolResponse]:
        instance_id = instance_id if instance_id is not None else str(uuid4())
        truth = create_kwarg("ground_truth", ground_truth, kwargs)
        self._instances[instance_id] = {"response": "", "ground_truth": truth, "reward": 0.0}
        return instance_id, ToolResponse()

    async def execute(
        self, instance_id: str, parameters: dict[str, Any] | str, **kwargs: Any
    ) -> tuple[ToolResponse, float, dict]:
        answer = parameters_as_dict(parameters).get("answer", "")
        answer = answer if isinstance(answer, str) else str(answer)
        state = self._instances[instance_id]
        state["response"] = answer if answer.startswith("#### ") else "#### " + answer
        reward = await self.calc_reward(instance_id)
        step_reward = 0.0 if reward > state["reward"] else NO_IMPROVEMENT_PENALTY
        state["reward"] = reward
        return ToolResponse(text=f"Current parsed answer={answer!r} reward={reward!r}"), step_reward, {}

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        state = self._instances[instance_id]
        if state["ground_truth"] is None:
            return 0.0
        return gsm8k.compute_score(
            state["response"], str(state["ground_truth"]), method="flexible", format_score=0.0, score=1.0
        )

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        self._instances.pop(instance_id, None)
