"""Build tools from a tools YAML (verl's format), failing with one message that names the entry.

    tools:
      - class_name: rlpost.tools.calculator_tool.CalculatorTool
        config: {type: native, timeout: 10}
        tool_schema:
          type: function
          function: {name: calculator, description: ..., parameters: {type: object, properties: ..., required: [...]}}

`tool_schema` may be left out when the class has a default schema. Only `type: native` tools exist
(verl's `mcp` type is refused by name).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlpost.tools.base_tool import BaseTool
from rlpost.tools.schemas import OpenAIFunctionToolSchema, ToolSchemaError
from rlpost.tools.utils.yaml_entries import ConfigEntryError, entry_error, import_class, load_entries

SUPPORTED_TOOL_TYPES = ("native",)


def get_tool_class(class_name: str) -> type:
    """The class at dotted path `class_name` (verl's name for this helper)."""
    return import_class(class_name)


def _build_tool(path: str | Path, index: int, entry: dict[str, Any]) -> BaseTool:
    class_name = entry.get("class_name")
    target = f"class_name {class_name!r}"
    if not isinstance(class_name, str):
        raise entry_error(path, "tools", index, "missing 'class_name' (a dotted path such as pkg.module.MyTool)")
    config = entry.get("config") or {}
    if not isinstance(config, dict):
        raise entry_error(path, "tools", index, f"'config' must be a mapping, got {config!r}", target)
    tool_type = config.get("type", "native")
    if tool_type not in SUPPORTED_TOOL_TYPES:
        raise entry_error(path, "tools", index, f"config.type {tool_type!r} is not supported; valid: "
                          f"{list(SUPPORTED_TOOL_TYPES)}", target)
    try:
        cls = get_tool_class(class_name)
    except ImportError as e:
        raise entry_error(path, "tools", index, f"unknown tool class: {e}", target) from e
    if not (isinstance(cls, type) and issubclass(cls, BaseTool)):
        raise entry_error(path, "tools", index, "the class must subclass rlpost.tools.base_tool.BaseTool", target)
    schema = entry.get("tool_schema")
    try:
        schema = None if schema is None else OpenAIFunctionToolSchema.model_validate(schema)
        return cls(config=config, tool_schema=schema)
    except ToolSchemaError as e:
        raise entry_error(path, "tools", index, f"bad tool_schema: {e}", target) from e
    except Exception as e:  # the user's constructor: report which entry broke, keep the cause
        raise entry_error(path, "tools", index, f"constructing the tool failed: {type(e).__name__}: {e}",
                          target) from e


def initialize_tools_from_config(tools_config_file: str | Path) -> list[BaseTool]:
    """One tool object per entry of the YAML, in file order.

    Raises:
        ConfigEntryError: unreadable file, unknown class, bad schema, unsupported type, failing
            constructor or two tools with the same function name; the message names the entry.
    """
    tools: list[BaseTool] = []
    seen: dict[str, int] = {}
    for index, entry in enumerate(load_entries(tools_config_file, "tools")):
        tool = _build_tool(tools_config_file, index, entry)
        if tool.name in seen:
            raise entry_error(tools_config_file, "tools", index,
                              f"tool name {tool.name!r} is already used by tools[{seen[tool.name]}]")
        seen[tool.name] = index
        tools.append(tool)
    return tools


def tools_by_name(tools_config_file: str | Path | None) -> dict[str, BaseTool]:
    """{function name: tool} for the YAML, or {} when no file is configured."""
    if not tools_config_file:
        return {}
    return {tool.name: tool for tool in initialize_tools_from_config(tools_config_file)}


__all__ = ["ConfigEntryError", "get_tool_class", "initialize_tools_from_config", "tools_by_name"]
