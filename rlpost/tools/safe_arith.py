"""Arithmetic on untrusted text without `eval`: the expression is parsed with `ast` and walked over a
whitelist of node types (numbers, + - * / // % **, unary + -, parentheses). Names, calls, attributes,
subscripts, strings, comparisons, ... are refused before anything runs, and sizes are bounded so a model
cannot make the process spin (`9**9**9`)."""

from __future__ import annotations

import ast
import operator
from typing import Callable, Union

Number = Union[int, float]

MAX_EXPRESSION_CHARS = 256
MAX_EXPONENT = 1000
MAX_ABS_RESULT = 10**100

_BINARY: dict[type, Callable[[Number, Number], Number]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type, Callable[[Number], Number]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}


class ArithmeticExpressionError(ValueError):
    """The text is not an allowed arithmetic expression, or evaluating it failed (division by zero,
    result too large); the message says which."""


def _check_size(value: Number) -> Number:
    if isinstance(value, complex):
        raise ArithmeticExpressionError("the result is not a real number")
    if abs(value) > MAX_ABS_RESULT:
        raise ArithmeticExpressionError(f"a result exceeds {MAX_ABS_RESULT:.0e} in magnitude")
    return value


def _eval_node(node: ast.AST) -> Number:
    if isinstance(node, ast.Constant):
        # bool is an int subclass: `True + 1` must not pass as arithmetic
        if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
            raise ArithmeticExpressionError(f"only numbers are allowed, got {node.value!r}")
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _check_size(_UNARY[type(node.op)](_eval_node(node.operand)))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval_node(node.left), _eval_node(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise ArithmeticExpressionError(f"exponents are limited to {MAX_EXPONENT} in magnitude, got {right}")
        try:
            return _check_size(_BINARY[type(node.op)](left, right))
        except ZeroDivisionError as e:
            raise ArithmeticExpressionError("division by zero") from e
        except OverflowError as e:
            raise ArithmeticExpressionError("the result is too large") from e
    what = type(node.op if isinstance(node, (ast.BinOp, ast.UnaryOp)) else node).__name__
    raise ArithmeticExpressionError(f"{what} is not allowed (only numbers, + - * / // % ** and ())")


def evaluate(expression: str) -> Number:
    """Value of an arithmetic expression such as `(12 + 3) * 4 ** 2 // 5`.

    Raises:
        ArithmeticExpressionError: anything but numbers, the six binary operators, ** and unary +/-, or
            a failed evaluation; the message is meant to be shown to the model.
    """
    if not isinstance(expression, str):
        raise ArithmeticExpressionError(f"the expression must be a string, got {type(expression).__name__}")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ArithmeticExpressionError(f"the expression is longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as e:
        raise ArithmeticExpressionError(f"cannot parse {expression!r}: {e.msg}") from e
    return _eval_node(tree.body)


def format_number(value: Number) -> str:
    """Integers exactly; floats with 12 significant digits (`7/2` -> `3.5`, `1/3` -> `0.333333333333`)."""
    return str(value) if isinstance(value, int) else f"{value:.12g}"
