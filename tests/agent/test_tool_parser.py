"""Hermes tool-call parsing: good, several, malformed (kept as text and counted), and the registry."""

import pytest

from rlpost.agent.tool_parser import TOOL_PARSERS, FunctionCall, get_tool_parser, parse_hermes


def test_one_call():
    text = 'Let me compute. <tool_call>\n{"name": "calculator", "arguments": {"expression": "2*3"}}\n</tool_call>'
    parsed = parse_hermes(text)
    assert parsed.calls == [FunctionCall("calculator", {"expression": "2*3"})]
    assert parsed.content == "Let me compute. "
    assert parsed.num_bad == 0


def test_several_calls_in_order():
    text = ('<tool_call>{"name": "a", "arguments": {"x": 1}}</tool_call> and '
            '<tool_call>{"name": "b", "arguments": {}}</tool_call> done')
    parsed = parse_hermes(text)
    assert [c.name for c in parsed.calls] == ["a", "b"]
    assert parsed.calls[0].arguments == {"x": 1}
    assert parsed.content == " and  done"


def test_malformed_blocks_are_counted_and_kept():
    bad_json = '<tool_call>{"name": "a", "arguments": {"x": 1}</tool_call>'  # missing a brace
    no_name = '<tool_call>{"arguments": {}}</tool_call>'
    list_args = '<tool_call>{"name": "a", "arguments": [1, 2]}</tool_call>'
    good = '<tool_call>{"name": "b", "arguments": {"y": 2}}</tool_call>'
    parsed = parse_hermes(f"x {bad_json} {no_name} {list_args} {good} y")
    assert parsed.calls == [FunctionCall("b", {"y": 2})]
    assert parsed.num_bad == 3
    assert parsed.content == f"x {bad_json} {no_name} {list_args}  y"


def test_unclosed_block_is_bad():
    parsed = parse_hermes('answer <tool_call>{"name": "a", "arguments": {}}')
    assert parsed.calls == [] and parsed.num_bad == 1
    assert parsed.content == 'answer <tool_call>{"name": "a", "arguments": {}}'


def test_arguments_as_json_string_and_missing():
    parsed = parse_hermes('<tool_call>{"name": "a", "arguments": "{\\"x\\": 3}"}</tool_call>'
                          '<tool_call>{"name": "b"}</tool_call>')
    assert parsed.calls == [FunctionCall("a", {"x": 3}), FunctionCall("b", {})]


def test_no_calls():
    parsed = parse_hermes("#### 42")
    assert (parsed.content, parsed.calls, parsed.num_bad) == ("#### 42", [], 0)


def test_registry():
    assert TOOL_PARSERS.names() == ["hermes", "qwen", "qwen25"]  # qwen, qwen25: SGLang's names of the same format
    assert get_tool_parser("qwen") is get_tool_parser("qwen25") is parse_hermes
    assert get_tool_parser("hermes") is parse_hermes
    with pytest.raises(ValueError, match=r"Unknown tool-call format 'hermez'.*Did you mean 'hermes'"):
        get_tool_parser("hermez")
