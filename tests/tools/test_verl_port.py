"""A tool written against verl's API runs unchanged once its imports say `rlpost`; verl's import paths of
the tools and interactions modules resolve."""

import asyncio
import importlib
from typing import Any, Optional
from uuid import uuid4

import pytest

from rlpost.tools.base_tool import BaseTool
from rlpost.tools.schemas import OpenAIFunctionToolSchema, ToolResponse


class VerlStyleTool(BaseTool):
    """Written as verl's current tools are: schema built with model_validate, create_kwargs read from
    kwargs, (ToolResponse, reward, metrics) returned."""

    def __init__(self, config: dict, tool_schema: OpenAIFunctionToolSchema):
        if tool_schema is None:
            tool_schema = OpenAIFunctionToolSchema.model_validate({
                "type": "function",
                "function": {"name": "lookup", "description": "Look a key up.", "parameters": {
                    "type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}},
            })
        super().__init__(config, tool_schema)
        self.dump = self.tool_schema.model_dump(exclude_unset=True, exclude_none=True)
        self._db: dict[str, dict] = {}

    async def create(self, instance_id: Optional[str] = None, **kwargs) -> tuple[str, ToolResponse]:
        instance_id = instance_id or str(uuid4())
        self._db[instance_id] = kwargs.get("create_kwargs", {}).get("table", {})
        return instance_id, ToolResponse()

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs) -> tuple[ToolResponse, float, dict]:
        value = self._db[instance_id].get(parameters["key"], "missing")
        return ToolResponse(text=str(value)), 0.0, {"hit": value != "missing"}


def test_verl_style_tool_runs():
    tool = VerlStyleTool({"type": "native"}, None)
    assert tool.name == "lookup"
    assert tool.dump["function"]["parameters"]["required"] == ["key"]

    async def go():
        iid, _ = await tool.create(create_kwargs={"table": {"a": 1}})
        return await tool.execute(iid, {"key": "a"}), await tool.execute(iid, {"key": "b"})

    (hit, miss) = asyncio.run(go())
    assert (hit[0].text, hit[2]) == ("1", {"hit": True})
    assert (miss[0].text, miss[2]) == ("missing", {"hit": False})


@pytest.mark.parametrize(
    "module, names",
    [
        ("rlpost.tools.base_tool", ["BaseTool"]),
        ("rlpost.tools.schemas", ["OpenAIFunctionToolSchema", "OpenAIFunctionSchema", "OpenAIFunctionParametersSchema",
                                  "OpenAIFunctionPropertySchema", "OpenAIFunctionCallSchema", "OpenAIFunctionToolCall",
                                  "ToolResponse"]),
        ("rlpost.tools.gsm8k_tool", ["Gsm8kTool"]),
        ("rlpost.tools.utils.tool_registry", ["initialize_tools_from_config", "get_tool_class"]),
        ("rlpost.interactions.base", ["BaseInteraction"]),
        ("rlpost.interactions.gsm8k_interaction", ["Gsm8kInteraction"]),
        ("rlpost.interactions.utils.interaction_registry", ["initialize_interactions_from_config",
                                                            "get_interaction_class"]),
    ],
)
def test_verl_import_paths(module, names):
    mod = importlib.import_module(module)
    assert [n for n in names if not hasattr(mod, n)] == []
