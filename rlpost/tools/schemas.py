"""OpenAI function-calling schemas of tools, and the response a tool returns.

The class names are verl's (`verl.tools.schemas`). They are plain dataclasses; `model_validate` and
`model_dump` are provided under pydantic's names because ported tools call them to build or print a
default schema.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any


class ToolSchemaError(ValueError):
    """A tool schema does not have the OpenAI function-calling shape; the message names the field."""


def _require(mapping: Any, where: str) -> dict[str, Any]:
    if not isinstance(mapping, dict):
        raise ToolSchemaError(f"{where} must be a mapping, got {type(mapping).__name__}: {mapping!r}")
    return mapping


def _str_field(mapping: dict[str, Any], key: str, where: str, required: bool = True) -> str | None:
    value = mapping.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str) or (required and not value):
        raise ToolSchemaError(f"{where}.{key} must be a non-empty string, got {value!r}")
    return value


@dataclass
class OpenAIFunctionPropertySchema:
    """One argument of a function. Keys other than type/description/enum (`items`, `minimum`, ...) are
    kept in `extra` and written back by `model_dump`, so the chat template sees the schema as given."""

    type: str
    description: str | None = None
    enum: list[str] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def model_validate(cls, data: Any, where: str = "property") -> OpenAIFunctionPropertySchema:
        data = _require(data, where)
        enum = data.get("enum")
        if enum is not None and not isinstance(enum, list):
            raise ToolSchemaError(f"{where}.enum must be a list, got {enum!r}")
        extra = {k: v for k, v in data.items() if k not in ("type", "description", "enum")}
        return cls(_str_field(data, "type", where), _str_field(data, "description", where, False), enum, extra)

    def model_dump(self, exclude_none: bool = True, **_: Any) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.type, "description": self.description, "enum": self.enum}
        out = {k: v for k, v in out.items() if v is not None or not exclude_none}
        return {**out, **self.extra}


@dataclass
class OpenAIFunctionParametersSchema:
    """The argument object of a function: `{"type": "object", "properties": {...}, "required": [...]}`."""

    type: str
    properties: dict[str, OpenAIFunctionPropertySchema] = field(default_factory=dict)
    required: list[str] = field(default_factory=list)

    @classmethod
    def model_validate(cls, data: Any, where: str = "parameters") -> OpenAIFunctionParametersSchema:
        data = _require(data, where)
        props = _require(data.get("properties", {}), f"{where}.properties")
        properties = {
            name: OpenAIFunctionPropertySchema.model_validate(p, f"{where}.properties.{name}")
            for name, p in props.items()
        }
        required = data.get("required", [])
        if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
            raise ToolSchemaError(f"{where}.required must be a list of argument names, got {required!r}")
        unknown = [r for r in required if r not in properties]
        if unknown:
            raise ToolSchemaError(f"{where}.required names {unknown}, which are not in properties {list(properties)}")
        return cls(_str_field(data, "type", where), properties, list(required))

    def model_dump(self, exclude_none: bool = True, **_: Any) -> dict[str, Any]:
        props = {k: v.model_dump(exclude_none=exclude_none) for k, v in self.properties.items()}
        return {"type": self.type, "properties": props, "required": list(self.required)}


@dataclass
class OpenAIFunctionSchema:
    """Name, description and arguments of a callable function."""

    name: str
    description: str
    parameters: OpenAIFunctionParametersSchema
    strict: bool = False

    @classmethod
    def model_validate(cls, data: Any, where: str = "function") -> OpenAIFunctionSchema:
        data = _require(data, where)
        description = data.get("description", "")
        if not isinstance(description, str):
            raise ToolSchemaError(f"{where}.description must be a string, got {description!r}")
        params = data.get("parameters", {"type": "object", "properties": {}, "required": []})
        parameters = OpenAIFunctionParametersSchema.model_validate(params, f"{where}.parameters")
        return cls(_str_field(data, "name", where), description, parameters, bool(data.get("strict", False)))

    def model_dump(self, exclude_none: bool = True, **_: Any) -> dict[str, Any]:
        out = {"name": self.name, "description": self.description, "parameters": self.parameters.model_dump()}
        return {**out, "strict": True} if self.strict else out


@dataclass
class OpenAIFunctionToolSchema:
    """A tool as the chat template's `tools=` argument lists it: `{"type": "function", "function": {...}}`."""

    type: str
    function: OpenAIFunctionSchema

    @classmethod
    def model_validate(cls, data: Any, where: str = "tool_schema") -> OpenAIFunctionToolSchema:
        if isinstance(data, cls):
            return data
        data = _require(data, where)
        kind = data.get("type")
        if kind != "function":
            raise ToolSchemaError(f"{where}.type must be 'function', got {kind!r}")
        return cls(kind, OpenAIFunctionSchema.model_validate(data.get("function"), f"{where}.function"))

    def model_dump(self, exclude_none: bool = True, **_: Any) -> dict[str, Any]:
        """The plain dict the chat template receives."""
        return {"type": self.type, "function": self.function.model_dump(exclude_none=exclude_none)}

    def model_dump_json(self) -> str:
        return json.dumps(self.model_dump())


@dataclass
class OpenAIFunctionCallSchema:
    """A parsed call: the function name and its decoded arguments."""

    name: str
    arguments: dict[str, Any]


@dataclass
class OpenAIFunctionToolCall:
    """One call of a registered tool, with the id the conversation refers to it by."""

    id: str
    function: OpenAIFunctionCallSchema
    type: str = "function"


@dataclass
class ToolResponse:
    """What `BaseTool.create` / `execute` return. Only `text` reaches the model for now; `image` and
    `video` exist so multimodal tools keep verl's shape."""

    text: str | None = None
    image: Any = None
    video: Any = None
