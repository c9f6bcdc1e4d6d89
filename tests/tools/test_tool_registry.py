"""Tools YAML loader: builds verl-format entries; every bad entry fails with one message naming it."""

import pytest

from rlpost.tools.calculator_tool import CalculatorTool
from rlpost.tools.gsm8k_tool import Gsm8kTool
from rlpost.tools.utils.tool_registry import initialize_tools_from_config, tools_by_name
from rlpost.tools.utils.yaml_entries import ConfigEntryError

GSM8K_ENTRY = """
  - class_name: rlpost.tools.gsm8k_tool.Gsm8kTool
    config: {type: native}
    tool_schema:
      type: function
      function:
        name: calc_gsm8k_reward
        description: Check the answer.
        parameters:
          type: object
          properties:
            answer: {type: string, description: The answer.}
          required: [answer]
"""


def write(tmp_path, body):
    path = tmp_path / "tools.yaml"
    path.write_text(body)
    return path


def test_loads_verl_format(tmp_path):
    path = write(tmp_path, "tools:" + GSM8K_ENTRY + """
  - class_name: rlpost.tools.calculator_tool.CalculatorTool
    config: {type: native, timeout: 5}
""")
    tools = initialize_tools_from_config(path)
    assert [type(t) for t in tools] == [Gsm8kTool, CalculatorTool]
    assert tools[0].get_openai_tool_schema().model_dump() == {
        "type": "function",
        "function": {
            "name": "calc_gsm8k_reward",
            "description": "Check the answer.",
            "parameters": {
                "type": "object",
                "properties": {"answer": {"type": "string", "description": "The answer."}},
                "required": ["answer"],
            },
        },
    }
    assert tools[1].name == "calculator" and tools[1].config == {"type": "native", "timeout": 5}
    assert sorted(tools_by_name(path)) == ["calc_gsm8k_reward", "calculator"]
    assert tools_by_name(None) == {}


def test_extra_property_keys_are_kept(tmp_path):
    path = write(tmp_path, """tools:
  - class_name: rlpost.tools.calculator_tool.CalculatorTool
    tool_schema:
      type: function
      function:
        name: calc
        description: d
        parameters:
          type: object
          properties:
            terms: {type: array, items: {type: number}}
          required: [terms]
""")
    (tool,) = initialize_tools_from_config(path)
    props = tool.tool_schema.model_dump()["function"]["parameters"]["properties"]
    assert props == {"terms": {"type": "array", "items": {"type": "number"}}}


@pytest.mark.parametrize(
    "entries, fragments",
    [
        ("  - class_name: no_such_pkg.tools.Tool\n    config: {type: native}\n",
         ["tools[1]", "no_such_pkg.tools.Tool", "unknown tool class", "cannot import module 'no_such_pkg.tools'"]),
        ("  - class_name: rlpost.tools.gsm8k_tool.NoSuchTool\n",
         ["tools[1]", "has no attribute 'NoSuchTool'"]),
        ("  - class_name: collections.OrderedDict\n", ["tools[1]", "must subclass rlpost.tools.base_tool.BaseTool"]),
        ("  - class_name: rlpost.tools.calculator_tool.CalculatorTool\n    tool_schema: {type: func, function: {}}\n",
         ["tools[1]", "bad tool_schema", "tool_schema.type must be 'function'"]),
        ("  - class_name: rlpost.tools.calculator_tool.CalculatorTool\n    tool_schema:\n      type: function\n"
         "      function: {name: c, parameters: {type: object, properties: {}, required: [x]}}\n",
         ["tools[1]", "tool_schema.function.parameters.required names ['x']"]),
        ("  - class_name: rlpost.tools.calculator_tool.CalculatorTool\n    tool_schema:\n      type: function\n"
         "      function: {description: no name}\n", ["tools[1]", "tool_schema.function.name must be a non-empty"]),
        ("  - class_name: rlpost.tools.calculator_tool.CalculatorTool\n    config: {type: mcp}\n",
         ["tools[1]", "config.type 'mcp' is not supported"]),
        ("  - class_name: rlpost.tools.gsm8k_tool.Gsm8kTool\n",
         ["tools[1]", "'calc_gsm8k_reward' is already used by tools[0]"]),
        ("  - config: {}\n", ["tools[1]", "missing 'class_name'"]),
    ],
)
def test_bad_entry_names_file_and_index(tmp_path, entries, fragments):
    path = write(tmp_path, "tools:" + GSM8K_ENTRY + entries)
    with pytest.raises(ConfigEntryError) as err:
        initialize_tools_from_config(path)
    message = str(err.value)
    assert message.startswith(f"{path}: ")
    for fragment in fragments:
        assert fragment in message


def test_bad_file(tmp_path):
    with pytest.raises(ConfigEntryError, match="file not found"):
        initialize_tools_from_config(tmp_path / "missing.yaml")
    with pytest.raises(ConfigEntryError, match="expected a list under 'tools'"):
        initialize_tools_from_config(write(tmp_path, "tool: []\n"))
