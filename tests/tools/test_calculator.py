"""CalculatorTool and its ast-whitelist arithmetic: values, refusals, errors as text."""

import asyncio

import pytest

from rlpost.tools.calculator_tool import CalculatorTool
from rlpost.tools.safe_arith import ArithmeticExpressionError, evaluate, format_number


@pytest.mark.parametrize(
    "expression, expected",
    [
        ("1 + 2 * 3", 7),
        ("(1 + 2) * 3", 9),
        ("7 / 2", 3.5),
        ("7 // 2", 3),
        ("-7 // 2", -4),
        ("7 % 3", 1),
        ("2 ** 10", 1024),
        ("-(3)", -3),
        ("+4 - -1", 5),
        ("1234 * 5678", 7006652),
        ("  ((2)) ", 2),
        ("1.5 * 4", 6.0),
    ],
)
def test_evaluate_values(expression, expected):
    assert evaluate(expression) == expected


@pytest.mark.parametrize(
    "expression, reason",
    [
        ("__import__('os').getcwd()", "Call"),
        ("x + 1", "Name"),
        ("(1).real", "Attribute"),
        ("[1, 2][0]", "Subscript"),
        ("'a' * 3", "only numbers"),
        ("lambda: 1", "Lambda"),
        ("1 if 1 else 2", "IfExp"),
        ("1 < 2", "Compare"),
        ("True + 1", "only numbers"),
        ("2j * 2", "only numbers"),
        ("1 & 3", "BitAnd is not allowed"),
        ("~1", "Invert is not allowed"),
        ("9 ** 9 ** 9", "exponents are limited"),
        ("10 ** 101", "exceeds"),
        ("1 / 0", "division by zero"),
        ("5 % 0", "division by zero"),
        ("(-8) ** 0.5", "not a real number"),
        ("1 +", "cannot parse"),
        ("1" * 300, "longer than 256"),
    ],
)
def test_evaluate_refuses(expression, reason):
    with pytest.raises(ArithmeticExpressionError, match=reason):
        evaluate(expression)


def test_refused_call_has_no_side_effect(tmp_path):
    target = tmp_path / "created.txt"
    with pytest.raises(ArithmeticExpressionError):
        evaluate(f"open({str(target)!r}, 'w')")
    assert not target.exists()


def test_format_number():
    assert format_number(408) == "408"
    assert format_number(3.5) == "3.5"
    assert format_number(4 / 2) == "2"
    assert format_number(1 / 3) == "0.333333333333"


def test_calculator_tool_schema_and_execute():
    tool = CalculatorTool(config={"type": "native"}, tool_schema=None)
    assert tool.name == "calculator"
    schema = tool.get_openai_tool_schema().model_dump()
    assert schema["function"]["parameters"]["required"] == ["expression"]

    async def go():
        instance_id, _ = await tool.create()
        ok = await tool.execute(instance_id, {"expression": "12 * 34"})
        bad = await tool.execute(instance_id, {"expression": "import os"})
        as_json = await tool.execute(instance_id, '{"expression": "2 ** 3"}')
        missing = await tool.execute(instance_id, {})
        await tool.release(instance_id)
        return ok, bad, as_json, missing

    ok, bad, as_json, missing = asyncio.run(go())
    assert (ok[0].text, ok[1], ok[2]) == ("408", 0.0, {"error": 0})
    assert bad[0].text.startswith("Error: cannot parse") and bad[2] == {"error": 1}
    assert as_json[0].text == "8"
    assert missing[0].text == "Error: the expression must be a string, got NoneType"
