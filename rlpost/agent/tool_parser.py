"""Tool calls in the model's decoded text, by format name (`multi_turn.format`).

`hermes` (Qwen2.5, Hermes, ...): each call is a block

    <tool_call>{"name": "calculator", "arguments": {"expression": "12*34"}}</tool_call>

A parser returns the calls it could decode and the text without their blocks. A block that is not a
JSON object with a string `name` and object `arguments` is a *bad* call: it is counted and left in the
text, and nothing runs for it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Callable

from rlpost.utils.registry import Registry

TOOL_PARSERS = Registry("tool-call format")

_HERMES_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_HERMES_OPEN = "<tool_call>"


@dataclass(frozen=True)
class FunctionCall:
    """A decoded call: the function name and its arguments."""

    name: str
    arguments: dict[str, Any]


@dataclass
class ParsedText:
    """Result of parsing one model turn.

    Attributes:
        content: the text with the decoded call blocks removed (bad blocks stay).
        calls: decoded calls in the order they appear.
        num_bad: blocks that could not be decoded (malformed JSON, missing name, unclosed block, ...).
    """

    content: str
    calls: list[FunctionCall] = field(default_factory=list)
    num_bad: int = 0


def _decode_call(body: str) -> FunctionCall | None:
    """The call in a block's body, or None when it is not `{"name": str, "arguments": object}`."""
    try:
        obj = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    arguments = obj.get("arguments", {})
    if isinstance(arguments, str):  # some models emit the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return None
    if not isinstance(arguments, dict):
        return None
    return FunctionCall(name=obj["name"], arguments=arguments)


# SGLang's `qwen25` / `qwen` detectors (Qwen 2.5 / 3 models) read the same `<tool_call>` JSON blocks;
# verl's multi-turn YAMLs select them as `format: qwen`.
@TOOL_PARSERS.register("qwen25")
@TOOL_PARSERS.register("qwen")
@TOOL_PARSERS.register("hermes")
def parse_hermes(text: str) -> ParsedText:
    """Split `<tool_call>{json}</tool_call>` blocks out of `text`.

    Example:
        >>> p = parse_hermes('Let me add. <tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>')
        >>> p.content, p.calls[0].name, p.calls[0].arguments, p.num_bad
        ('Let me add. ', 'add', {'a': 1}, 0)
    """
    calls: list[FunctionCall] = []
    num_bad = 0
    pieces: list[str] = []
    end = 0
    for match in _HERMES_BLOCK.finditer(text):
        call = _decode_call(match.group(1).strip())
        pieces.append(text[end : match.start()])
        if call is None:
            num_bad += 1
            pieces.append(match.group(0))
        else:
            calls.append(call)
        end = match.end()
    rest = text[end:]
    num_bad += rest.count(_HERMES_OPEN)  # opened but never closed
    pieces.append(rest)
    return ParsedText(content="".join(pieces), calls=calls, num_bad=num_bad)


def get_tool_parser(name: str) -> Callable[[str], ParsedText]:
    """The parser of format `name`; an unknown name lists the registered formats."""
    return TOOL_PARSERS.get(name)
