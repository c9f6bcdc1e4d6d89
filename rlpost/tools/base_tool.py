"""`BaseTool`: the async tool interface of multi-turn rollouts, with verl's method names and returns.

A tool object is built once per process from the tools YAML; each trajectory gets its own *instance*
(`create` -> `execute`* -> `calc_reward` -> `release`), identified by `instance_id`, so a tool keeps
per-trajectory state in a dict keyed by it. A verl tool ports by changing `verl` to `rlpost` in its
imports.
"""

from __future__ import annotations

import json
from typing import Any
from uuid import uuid4

from rlpost.tools.schemas import OpenAIFunctionToolSchema, ToolResponse


class BaseTool:
    """Base class of tools.

    Args:
        config: the entry's free-form `config` mapping from the tools YAML (`type: native`, ...).
            `timeout` (seconds), when present, bounds each `execute` call of this tool.
        tool_schema: the OpenAI function schema (a dict is validated). May be None when the subclass'
            `get_openai_tool_schema` returns a default one.

    Attributes:
        name: the function name the model calls the tool by.
    """

    def __init__(self, config: dict[str, Any], tool_schema: OpenAIFunctionToolSchema | dict | None) -> None:
        self.config = dict(config or {})
        self.tool_schema = None if tool_schema is None else OpenAIFunctionToolSchema.model_validate(tool_schema)
        schema = self.get_openai_tool_schema()
        if schema is None:
            raise ValueError(f"{type(self).__name__}: no tool_schema given and the class defines no default schema")
        self.tool_schema = OpenAIFunctionToolSchema.model_validate(schema)
        self.name: str = self.tool_schema.function.name

    def get_openai_tool_schema(self) -> OpenAIFunctionToolSchema | None:
        """The schema shown to the model (override to supply a default when the YAML gives none)."""
        return self.tool_schema

    async def create(self, instance_id: str | None = None, **kwargs: Any) -> tuple[str, ToolResponse]:
        """Start an instance for one trajectory.

        Args:
            instance_id: id to use; a fresh uuid when None.
            **kwargs: `create_kwargs=` the sample's `tools_kwargs[<tool name>]["create_kwargs"]`.

        Returns:
            (instance_id, response): the response's text, if any, is not shown to the model.
        """
        return (instance_id if instance_id is not None else str(uuid4())), ToolResponse()

    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
    ) -> tuple[ToolResponse | str, float, dict]:
        """Run one call.

        Args:
            instance_id: id returned by `create`.
            parameters: the decoded JSON arguments of the call.

        Returns:
            (response, step_reward, metrics): the response text becomes the tool message.
        """
        return ToolResponse(text="Updated the tool state."), 0.0, {}

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        """Reward of the instance's current state."""
        return 0.0

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        """Drop the instance's state."""


def parameters_as_dict(parameters: dict[str, Any] | str) -> dict[str, Any]:
    """Arguments as a dict: older verl tools received them as a JSON string. Anything that is not a JSON
    object becomes {}."""
    if isinstance(parameters, str):
        try:
            parameters = json.loads(parameters)
        except json.JSONDecodeError:
            return {}
    return parameters if isinstance(parameters, dict) else {}


def create_kwarg(name: str, value: Any, kwargs: dict[str, Any]) -> Any:
    """A `create` argument given directly (`ground_truth=...`) or inside `create_kwargs={...}` (the way
    verl's agent loop passes it)."""
    if value is not None:
        return value
    return (kwargs.get("create_kwargs") or {}).get(name)
