"""Tool-call parsing per format: good, several, malformed (kept as text and counted), and the registry."""

import pytest

from rlpost.agent.config import AgentLoopConfig
from rlpost.agent.tool_parser import (
    TOOL_PARSERS,
    FunctionCall,
    get_tool_parser,
    parse_gpt_oss,
    parse_hermes,
    parse_llama3,
    parse_mistral,
    parse_pythonic,
)

pytestmark = pytest.mark.timeout(30)


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


def test_hermes_with_special_tokens_kept():
    parsed = parse_hermes('<tool_call>{"name": "a", "arguments": {}}</tool_call><|im_end|>')
    assert parsed.calls == [FunctionCall("a", {})] and parsed.content == "<|im_end|>"


# ---- llama3: JSON objects, optionally after <|python_tag|>, separated by ";"


def test_llama3_one_call_with_parameters_key():
    parsed = parse_llama3('{"name": "calculator", "parameters": {"expression": "2*3"}}<|eot_id|>')
    assert parsed.calls == [FunctionCall("calculator", {"expression": "2*3"})]
    assert (parsed.content, parsed.num_bad) == ("", 0)


def test_llama3_python_tag_and_several_calls():
    text = 'Let me look. <|python_tag|>{"name": "a", "parameters": {"x": "1;2"}}; {"name": "b", "arguments": {}}<|eom_id|>'
    parsed = parse_llama3(text)
    assert parsed.calls == [FunctionCall("a", {"x": "1;2"}), FunctionCall("b", {})]
    assert (parsed.content, parsed.num_bad) == ("Let me look. ", 0)


def test_llama3_plain_text_is_content():
    parsed = parse_llama3("The answer is {42}.<|eot_id|>")
    assert (parsed.content, parsed.calls, parsed.num_bad) == ("The answer is {42}.", [], 0)


@pytest.mark.parametrize("text", [
    '{"name": "a", "parameters": {"x": 1}',             # unclosed object
    '{"parameters": {"x": 1}}',                          # no name
    '<|python_tag|>print("hi")',                         # code for a built-in tool, not a JSON call
])
def test_llama3_malformed_is_one_bad_call_kept(text):
    parsed = parse_llama3(text + "<|eot_id|>")
    assert parsed.calls == [] and parsed.num_bad == 1 and parsed.content == text


@pytest.mark.parametrize("text", ['{"name": "a", "parameters": {}}; {"name": 3}',
                                  '{"name": "a", "parameters": {}} and more text'])
def test_llama3_bad_rest_after_a_good_call(text):
    parsed = parse_llama3(text)  # the good call runs, the rest is one bad call and the text stays
    assert parsed.calls == [FunctionCall("a", {})] and parsed.num_bad == 1 and parsed.content == text


# ---- mistral: [TOOL_CALLS] + a JSON list (v3), or name[ARGS]{...} (v11+)


def test_mistral_json_list_several_calls():
    text = 'Sure.[TOOL_CALLS][{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": "{\\"y\\": 2}"}]</s>'
    parsed = parse_mistral(text)
    assert parsed.calls == [FunctionCall("a", {"x": 1}), FunctionCall("b", {"y": 2})]
    assert (parsed.content, parsed.num_bad) == ("Sure.", 0)


def test_mistral_args_format_several_calls():
    parsed = parse_mistral('[TOOL_CALLS]a[ARGS]{"x": 1}[TOOL_CALLS]b[CALL_ID]abc123XYZ[ARGS]{}</s>')
    assert parsed.calls == [FunctionCall("a", {"x": 1}), FunctionCall("b", {})]
    assert (parsed.content, parsed.num_bad) == ("", 0)


def test_mistral_malformed_segments_counted_and_kept():
    text = ('[TOOL_CALLS][{"name": "a", "arguments": {}}, {"arguments": {}}]'  # second element has no name
            '[TOOL_CALLS]b[ARGS]{"x": '                                          # broken JSON
            '[TOOL_CALLS]c[ARGS]{"z": 3}')
    parsed = parse_mistral(text)
    assert parsed.calls == [FunctionCall("a", {}), FunctionCall("c", {"z": 3})]
    assert parsed.num_bad == 2
    assert parsed.content == ('[TOOL_CALLS][{"name": "a", "arguments": {}}, {"arguments": {}}]'
                              '[TOOL_CALLS]b[ARGS]{"x": ')


def test_mistral_no_calls():
    assert parse_mistral("#### 42</s>").content == "#### 42"


# ---- pythonic: [f(a=1), g(b="x")]


def test_pythonic_several_calls_after_text():
    parsed = parse_pythonic('I will call. [calculator(expression="2*3"), search(query="x", k=[1, 2])]<|eot_id|>')
    assert parsed.calls == [FunctionCall("calculator", {"expression": "2*3"}),
                            FunctionCall("search", {"query": "x", "k": [1, 2]})]
    assert (parsed.content, parsed.num_bad) == ("I will call. ", 0)


def test_pythonic_llama4_markers():
    parsed = parse_pythonic('<|python_start|>[get_weather(city="Paris")]<|python_end|><|eot|>')
    assert parsed.calls == [FunctionCall("get_weather", {"city": "Paris"})] and parsed.num_bad == 0


def test_pythonic_malformed():
    unclosed = parse_pythonic('[add(a=1, b=2)')
    assert (unclosed.calls, unclosed.num_bad, unclosed.content) == ([], 1, "[add(a=1, b=2)")
    text = '[add(a=1), add(1, 2), run(cmd=__import__("os"))]'  # positional args; a non-literal value
    mixed = parse_pythonic(text)
    assert mixed.calls == [FunctionCall("add", {"a": 1})] and mixed.num_bad == 2 and mixed.content == text


def test_pythonic_prose_with_brackets_is_content():
    parsed = parse_pythonic("The list [1, 2] has two items.")
    assert (parsed.calls, parsed.num_bad) == ([], 0)


# ---- gpt-oss (harmony): <|channel|>commentary to=functions.NAME ...<|message|>{json}<|call|>


def test_gpt_oss_call_after_analysis():
    text = ('<|channel|>analysis<|message|>Need to compute; maybe to=functions.fake in thought.<|end|>'
            '<|start|>assistant<|channel|>commentary to=functions.calculator <|constrain|>json<|message|>'
            '{"expression": "2*3"}<|call|>')
    parsed = parse_gpt_oss(text)
    assert parsed.calls == [FunctionCall("calculator", {"expression": "2*3"})]
    assert parsed.num_bad == 0
    assert parsed.content == '<|channel|>analysis<|message|>Need to compute; maybe to=functions.fake in thought.<|end|>'


def test_gpt_oss_recipient_before_channel_and_several_calls():
    text = ('<|start|>assistant to=functions.a<|channel|>commentary json<|message|>{"x": 1}<|call|>'
            '<|start|>assistant<|channel|>commentary to=functions.b<|message|>{}<|call|>')
    parsed = parse_gpt_oss(text)
    assert parsed.calls == [FunctionCall("a", {"x": 1}), FunctionCall("b", {})]
    assert (parsed.content, parsed.num_bad) == ("", 0)


def test_gpt_oss_final_answer_and_builtin_tool_are_content():
    text = ('<|channel|>commentary to=browser.search<|message|>{"q": "x"}<|call|>'
            '<|start|>assistant<|channel|>final<|message|>#### 42<|return|>')
    parsed = parse_gpt_oss(text)
    assert (parsed.calls, parsed.num_bad, parsed.content) == ([], 0, text)


def test_gpt_oss_malformed_calls_counted_and_kept():
    bad_json = '<|channel|>commentary to=functions.a<|message|>{"x": <|call|>'
    unclosed = '<|start|>assistant<|channel|>commentary to=functions.b<|message|>{"y": 1}'
    parsed = parse_gpt_oss(bad_json + unclosed)
    assert parsed.calls == [] and parsed.num_bad == 2 and parsed.content == bad_json + unclosed


# ---- registry


def test_registry():
    assert TOOL_PARSERS.names() == ["gpt-oss", "hermes", "llama3", "mistral", "pythonic", "qwen", "qwen25"]
    assert get_tool_parser("qwen") is get_tool_parser("qwen25") is parse_hermes  # SGLang's names of hermes
    assert get_tool_parser("hermes") is parse_hermes
    assert get_tool_parser("gpt-oss") is parse_gpt_oss and get_tool_parser("llama3") is parse_llama3
    with pytest.raises(ValueError, match=r"Unknown tool-call format 'hermez'.*Did you mean 'hermes'"):
        get_tool_parser("hermez")


def test_config_checks_the_format_against_the_registry():
    assert AgentLoopConfig(response_length=8, format="mistral").format == "mistral"
    with pytest.raises(ValueError, match=r"multi_turn.format='llama3_json'.*'gpt-oss'.*'llama3'.*'pythonic'"):
        AgentLoopConfig(response_length=8, format="llama3_json")
