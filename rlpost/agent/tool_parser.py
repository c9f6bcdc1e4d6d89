"""Tool calls in the model's decoded text (special tokens kept), by format name (`multi_turn.format`).

    hermes / qwen / qwen25   <tool_call>{"name": "calc", "arguments": {"expression": "12*34"}}</tool_call>
    llama3                   [<|python_tag|>]{"name": "calc", "parameters": {...}}[; {...}]<|eot_id|>
    mistral                  [TOOL_CALLS][{"name": "calc", "arguments": {...}}, ...]   or
                             [TOOL_CALLS]calc[ARGS]{...}[TOOL_CALLS]other[ARGS]{...}
    pythonic                 [calc(expression="12*34"), search(query="x")]
    gpt-oss                  <|channel|>commentary to=functions.calc <|constrain|>json<|message|>{...}<|call|>

A parser returns the calls it could decode and the text without them. A call that does not decode (bad
JSON, no name, arguments that are not an object, a block never closed, ...) is a *bad* call: it is counted
and left in the text, and nothing runs for it.
"""

from __future__ import annotations

import ast
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


def _arguments(value: Any) -> dict[str, Any] | None:
    """Arguments as a dict (some models write them as a JSON string); None when they are not an object."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            return None
    return value if isinstance(value, dict) else None


def _call_from_object(obj: Any, args_key: str = "arguments") -> FunctionCall | None:
    """The call in `{"name": str, args_key: object}` (missing arguments: {}), else None."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    arguments = _arguments(obj.get(args_key, {}))
    return None if arguments is None else FunctionCall(name=obj["name"], arguments=arguments)


def _decode_call(body: str, args_key: str = "arguments") -> FunctionCall | None:
    """The call in a JSON text, or None when it is not `{"name": str, args_key: object}`."""
    try:
        return _call_from_object(json.loads(body), args_key)
    except json.JSONDecodeError:
        return None


def _strip_suffixes(text: str, suffixes: tuple[str, ...]) -> str:
    """`text` without trailing end-of-turn tokens (and the whitespace around them)."""
    stripped, previous = text.rstrip(), None
    while stripped != previous:
        previous = stripped
        for suffix in suffixes:
            stripped = stripped.removesuffix(suffix).rstrip()
    return stripped


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


def _json_prefix(text: str, pos: int = 0) -> tuple[Any, int] | None:
    """The JSON value starting at `pos` (after whitespace) and the index after it; None when there is none."""
    start = len(text) - len(text[pos:].lstrip())
    try:
        return json.JSONDecoder().raw_decode(text, start)
    except json.JSONDecodeError:
        return None


def _json_sequence(text: str, separator: str) -> tuple[list[Any], str]:
    """JSON values at the start of `text` separated by `separator` (and whitespace): (values, the text
    left from the first place where no further value follows)."""
    values: list[Any] = []
    pos = 0
    while (decoded := _json_prefix(text, pos)) is not None:
        value, end = decoded
        values.append(value)
        rest = text[end:].lstrip()
        if not rest.startswith(separator):
            return values, text[end:]
        pos = len(text) - len(rest) + len(separator)
    return values, text[pos:]


_LLAMA3_TAG = "<|python_tag|>"
_LLAMA3_END = ("<|eot_id|>", "<|eom_id|>", "<|end_of_text|>")


@TOOL_PARSERS.register("llama3")
def parse_llama3(text: str) -> ParsedText:
    """Llama 3.1-3.3 JSON calls: a turn that is `{"name": ..., "parameters": {...}}` objects separated by
    `;`, optionally after `<|python_tag|>` (text before the tag is content). A turn that starts with `{` (or
    has the tag) but does not decode to calls is one bad call.

    Example:
        >>> parse_llama3('{"name": "add", "parameters": {"a": 1}}<|eot_id|>').calls
        [FunctionCall(name='add', arguments={'a': 1})]
    """
    text = _strip_suffixes(text, _LLAMA3_END)
    head, tag, body = text.partition(_LLAMA3_TAG)
    if not tag:
        if not text.lstrip().startswith("{"):
            return ParsedText(content=text)
        head, body = "", text
    objects, rest = _json_sequence(body, ";")
    calls = [_call_from_object(o, "parameters" if isinstance(o, dict) and "parameters" in o else "arguments")
             for o in objects]
    if not objects or None in calls or rest.strip():
        # one bad call: the whole call text stays, the calls that did decode still run
        good = [c for c in calls if c is not None]
        return ParsedText(content=text, calls=good, num_bad=1)
    return ParsedText(content=head, calls=calls)


_MISTRAL_TAG = "[TOOL_CALLS]"
_MISTRAL_ARGS = "[ARGS]"
_MISTRAL_END = ("</s>",)


def _mistral_segment(segment: str) -> tuple[list[FunctionCall], int]:
    """Calls of the text after one `[TOOL_CALLS]`: a JSON list of `{"name", "arguments"}` (v3 tokenizers)
    or `name[ARGS]{...}` (v11+ tokenizers, where `[CALL_ID]id` may follow the name)."""
    if segment.lstrip().startswith("["):
        decoded = _json_prefix(segment)
        if decoded is None or not isinstance(decoded[0], list) or segment[decoded[1]:].strip():
            return [], 1
        calls = [_call_from_object(o) for o in decoded[0]]
        return [c for c in calls if c is not None], calls.count(None) + (not calls)
    name, sep, args = segment.partition(_MISTRAL_ARGS)
    name = name.split("[CALL_ID]")[0].strip()
    arguments = _arguments(args.strip()) if sep else None
    if not name or arguments is None:
        return [], 1
    return [FunctionCall(name=name, arguments=arguments)], 0


@TOOL_PARSERS.register("mistral")
def parse_mistral(text: str) -> ParsedText:
    """Mistral calls after `[TOOL_CALLS]` (see `_mistral_segment`); the text before the first tag is the
    content. A segment with a bad call stays in the content; its good calls still run.

    Example:
        >>> parse_mistral('[TOOL_CALLS][{"name": "add", "arguments": {"a": 1}}]</s>').calls
        [FunctionCall(name='add', arguments={'a': 1})]
    """
    text = _strip_suffixes(text, _MISTRAL_END)
    content, *segments = text.split(_MISTRAL_TAG)
    calls: list[FunctionCall] = []
    num_bad = 0
    for segment in segments:
        good, bad = _mistral_segment(segment)
        calls += good
        num_bad += bad
        if bad:
            content += _MISTRAL_TAG + segment
    return ParsedText(content=content, calls=calls, num_bad=num_bad)


_PYTHONIC_START = re.compile(r"\[\s*[A-Za-z_][\w.]*\(")
_PYTHONIC_MARKERS = ("<|python_start|>", "<|python_end|>")
_PYTHONIC_END = ("<|eot_id|>", "<|eom_id|>", "<|eot|>", "<|eom|>", "<|end_of_text|>")


def _pythonic_call(node: ast.expr) -> FunctionCall | None:
    """`name(key=literal, ...)` as a call; None for anything else (positional args, non-literal values)."""
    if not isinstance(node, ast.Call) or node.args or not isinstance(node.func, (ast.Name, ast.Attribute)):
        return None
    try:
        arguments = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords if kw.arg is not None}
    except (ValueError, TypeError, SyntaxError, RecursionError):
        return None
    if len(arguments) != len(node.keywords):
        return None  # a **kwargs expansion
    return FunctionCall(name=ast.unparse(node.func), arguments=arguments)


@TOOL_PARSERS.register("pythonic")
def parse_pythonic(text: str) -> ParsedText:
    """A Python list of keyword calls, `[f(a=1), g(b="x")]` (Llama 3.2 / 4 pythonic; Llama 4 wraps it in
    `<|python_start|>...<|python_end|>`), from the first `[name(` to the end of the turn. Values are read
    with `ast.literal_eval` (nothing is executed). A list that does not parse is one bad call; an element
    that is not a keyword call with literal values is a bad call, and then the list stays in the content.

    Example:
        >>> parse_pythonic('[add(a=1, b=2)]').calls
        [FunctionCall(name='add', arguments={'a': 1, 'b': 2})]
    """
    text = _strip_suffixes(text, _PYTHONIC_END)
    plain = text
    for marker in _PYTHONIC_MARKERS:
        plain = plain.replace(marker, "")
    match = _PYTHONIC_START.search(plain)
    if match is None:
        return ParsedText(content=text)
    try:
        tree = ast.parse(plain[match.start():].strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError):
        return ParsedText(content=text, num_bad=1)
    if not isinstance(tree.body, ast.List):
        return ParsedText(content=text, num_bad=1)
    calls = [_pythonic_call(node) for node in tree.body.elts]
    good = [c for c in calls if c is not None]
    if None in calls:
        return ParsedText(content=text, calls=good, num_bad=calls.count(None))
    return ParsedText(content=plain[: match.start()], calls=good)


# One harmony message: header, <|message|>, body, and how it ended (the end of the text: never closed).
_HARMONY_MESSAGE = re.compile(r"(.*?)<\|message\|>(.*?)(<\|end\|>|<\|call\|>|<\|return\|>|\Z)", re.DOTALL)
_HARMONY_RECIPIENT = re.compile(r"to=functions\.([^\s<]+)")


@TOOL_PARSERS.register("gpt-oss")
def parse_gpt_oss(text: str) -> ParsedText:
    """gpt-oss (harmony) calls: a message whose header names `to=functions.<name>` (before or after
    `<|channel|>`), with a JSON object body ended by `<|call|>`. Other messages (analysis, final, calls to
    built-in tools such as `browser.*`) are content. A functions message whose body is not a JSON object,
    or that does not end with `<|call|>`, is a bad call.

    Example:
        >>> parse_gpt_oss('<|channel|>commentary to=functions.add<|message|>{"a": 1}<|call|>').calls
        [FunctionCall(name='add', arguments={'a': 1})]
    """
    calls: list[FunctionCall] = []
    num_bad = 0
    pieces: list[str] = []
    end = 0
    for match in _HARMONY_MESSAGE.finditer(text):
        recipient = _HARMONY_RECIPIENT.search(match.group(1))
        if recipient is None:
            continue
        arguments = _arguments(match.group(2).strip()) if match.group(3) == "<|call|>" else None
        pieces.append(text[end : match.start()])
        if arguments is None:
            num_bad += 1
            pieces.append(match.group(0))
        else:
            calls.append(FunctionCall(name=recipient.group(1), arguments=arguments))
        end = match.end()
    pieces.append(text[end:])
    return ParsedText(content="".join(pieces), calls=calls, num_bad=num_bad)


def get_tool_parser(name: str) -> Callable[[str], ParsedText]:
    """The parser of format `name`; an unknown name lists the registered formats."""
    return TOOL_PARSERS.get(name)
