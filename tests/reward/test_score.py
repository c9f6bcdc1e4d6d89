"""Built-in scorers: GSM8K (strict/flexible), boxed math, the arithmetic task, data-source dispatch."""

import pytest

from rlpost.reward import default_compute_score
from rlpost.reward.score import arith, geo3k, gsm8k, math_boxed


@pytest.mark.parametrize(
    "text,method,expected",
    [
        ("so 3+4 = 7 #### 7", "strict", 1.0),
        ("#### 1,234", "strict", 1.0),
        ("the answer is 7", "strict", 0.0),  # no ####: strict finds nothing
        ("the answer is 7", "flexible", 1.0),
        ("#### 8", "strict", 0.0),
        ("#### 7 then #### 9", "strict", 0.0),  # the last answer counts
    ],
)
def test_gsm8k(text, method, expected):
    gt = "1234" if "1,234" in text else "7"
    assert gsm8k.compute_score(text, gt, method=method) == expected


def test_gsm8k_format_score_and_extract():
    assert gsm8k.compute_score("#### 8", "7", format_score=0.1) == 0.1
    assert gsm8k.extract_solution("x #### -3.5.", "strict") == "-3.5"
    with pytest.raises(ValueError, match="strict"):
        gsm8k.extract_solution("1", "loose")


@pytest.mark.parametrize(
    "text,gt,expected",
    [
        ("so \\boxed{\\frac{1}{2}}", "\\frac12", 1.0),
        ("\\boxed{\\dfrac{1}{2}}", "1/2", 1.0),
        ("\\boxed{ .5 }", "0.5", 1.0),
        ("\\boxed{x = 3}", "3", 1.0),
        ("\\boxed{90^\\circ}", "90", 1.0),
        ("\\boxed{\\left(1, 2\\right)}", "(1,2)", 1.0),
        ("\\boxed{3}", "\\boxed{3}", 1.0),
        ("\\boxed{\\sqrt{2}} then \\boxed{4}", "4", 1.0),
        ("\\boxed{5}", "4", 0.0),
        ("the answer is 4", "4", 0.0),
        ("\\fbox{7}", "7", 1.0),
    ],
)
def test_math_boxed(text, gt, expected):
    assert math_boxed.compute_score(text, gt) == expected


def test_boxed_nested_braces():
    assert math_boxed.last_boxed_content("a \\boxed{\\frac{a}{b}} b") == "\\frac{a}{b}"
    assert math_boxed.last_boxed_content("\\boxed{unclosed") is None


@pytest.mark.parametrize(
    "text,expected",
    [("#### 68", 1.0), ("  ####  68 ", 1.0), ("#### 67", 0.0), ("68", 0.0), ("#### 68 and more", 0.0),
     ("#### 1 #### 68", 1.0), ("####", 0.0)],
)
def test_arith(text, expected):
    assert arith.compute_score(text, "68") == expected


def test_arith_format_score_and_negative():
    assert arith.compute_score("#### 5", "6", format_score=0.1) == 0.1
    assert arith.compute_score("#### -12", "-12") == 1.0


@pytest.mark.parametrize("text, expected", [
    ("<think>angle sum</think> so \\boxed{30}", 1.0),  # right and well formed
    ("the angle is \\boxed{30}", 0.9),  # right, no think block: accuracy only
    ("<think>guess</think> \\boxed{45}", 0.1),  # well formed, wrong: the format share only
    ("<think>x</think> 30", 0.0),  # no boxed answer: neither
    ("<think>x</think> \\boxed{\\frac{60}{2}}", 0.1),  # equal value, other notation: not the same answer
])
def test_geo3k_accuracy_and_format_shares(text, expected):
    assert geo3k.compute_score(text, "30") == pytest.approx(expected)
    assert default_compute_score("hiyouga/geometry3k", text, "30") == pytest.approx(expected)


def test_default_compute_score_dispatch():
    assert default_compute_score("openai/gsm8k", "#### 7", "7") == 1.0
    assert default_compute_score("lighteval/MATH", "\\boxed{7}", "7") == 1.0
    assert default_compute_score("DigitalLearningGmbH/MATH-lighteval", "\\boxed{7}", "8") == 0.0
    assert default_compute_score("rlpost/arith", "#### 7", "7", extra_info={"a": 1}) == 1.0
    with pytest.raises(NotImplementedError, match="my/data.*known data sources.*openai/gsm8k"):
        default_compute_score("my/data", "x", "y")


def test_tool_bonus_and_multi_tool_penalty():
    right, wrong = ("rlpost/arith", "#### 7", "7"), ("rlpost/arith", "#### 8", "7")
    shaping = {"use_tool_bonus": True, "tool_bonus": 0.5, "multi_tool_penalty": 0.1}
    assert default_compute_score(*right, extra_info={"tool_calls": 1}, **shaping) == 1.5
    assert default_compute_score(*right, extra_info={"tool_calls": 3}, **shaping) == pytest.approx(1.3)
    assert default_compute_score(*right, extra_info={"tool_calls": 0}, **shaping) == 1.0  # no call: no bonus
    assert default_compute_score(*wrong, extra_info={"tool_calls": 1}, **shaping) == 0.0  # wrong: no bonus
    assert default_compute_score(*wrong, extra_info={"tool_calls": 2}, **shaping) == pytest.approx(-0.1)
    assert default_compute_score(*right, extra_info={"tool_calls": 2}) == 1.0  # shaping is off by default
    with pytest.raises(TypeError, match="bonus"):
        default_compute_score(*right, bonus=1.0)  # an unknown kwarg is an error, never ignored
