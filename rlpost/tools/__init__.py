"""Tools a model calls during multi-turn rollouts: the `BaseTool` interface, schemas, the tools-YAML
loader and the built-in `Gsm8kTool` and `CalculatorTool`."""

from rlpost.tools.base_tool import BaseTool
from rlpost.tools.schemas import OpenAIFunctionToolSchema, ToolResponse, ToolSchemaError
from rlpost.tools.utils.tool_registry import initialize_tools_from_config, tools_by_name
from rlpost.tools.utils.yaml_entries import ConfigEntryError

__all__ = [
    "BaseTool",
    "ConfigEntryError",
    "OpenAIFunctionToolSchema",
    "ToolResponse",
    "ToolSchemaError",
    "initialize_tools_from_config",
    "tools_by_name",
]
