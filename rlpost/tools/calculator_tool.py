"""`CalculatorTool`: evaluates an arithmetic expression for the model (see `safe_arith` for what is
allowed). A bad expression is not a tool failure: its error text is the tool's answer."""

from __future__ import annotations

from typing import Any

from rlpost.tools.base_tool import BaseTool, parameters_as_dict
from rlpost.tools.safe_arith import ArithmeticExpressionError, evaluate, format_number
from rlpost.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

DEFAULT_SCHEMA = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression with + - * / // % ** and parentheses.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "For example (1234 * 5678) + 9."}},
            "required": ["expression"],
        },
    },
}


class CalculatorTool(BaseTool):
    """Stateless calculator: `execute(id, {"expression": "12*34"})` -> ("408", 0.0, {"error": 0})."""

    def get_openai_tool_schema(self) -> OpenAIFunctionToolSchema:
        return self.tool_schema or OpenAIFunctionToolSchema.model_validate(DEFAULT_SCHEMA)

    async def execute(
        self, instance_id: str, parameters: dict[str, Any] | str, **kwargs: Any
    ) -> tuple[ToolResponse, float, dict]:
        expression = parameters_as_dict(parameters).get("expression")
        try:
            text = format_number(evaluate(expression))
        except ArithmeticExpressionError as e:
            return ToolResponse(text=f"Error: {e}"), 0.0, {"error": 1}
        return ToolResponse(text=text), 0.0, {"error": 0}
