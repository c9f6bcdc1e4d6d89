"""Whatever a tool's `execute` returns reaches the model as text and the rollout goes on: verl's
(response, reward, metrics), a dict or a number as the response, a reward that is not a number (0.0), each odd
shape logged with the tool's name."""

from __future__ import annotations

import asyncio
import logging

import pytest

from rlpost.agent.tool_calls import ToolSession
from rlpost.agent.tool_parser import FunctionCall
from rlpost.tools.base_tool import BaseTool
from rlpost.tools.schemas import ToolResponse

pytestmark = pytest.mark.timeout(60)


class _Returns(BaseTool):
    """A tool whose `execute` returns the value it was built with."""

    def __init__(self, value):
        super().__init__({"type": "native"}, {"type": "function", "function": {
            "name": "t", "description": "returns a fixed value", "parameters": {"type": "object", "properties": {}}}})
        self.value = value

    async def execute(self, instance_id, parameters, **kwargs):
        return self.value


def _call(value):
    session = ToolSession({"t": _Returns(value)}, {}, 5.0)
    result = asyncio.run(session.call(FunctionCall(name="t", arguments={})))
    return result, session.step_rewards


@pytest.mark.parametrize("value, text, reward", [
    ((ToolResponse(text="ok"), 0.5, {}), "ok", 0.5),           # verl's shape
    (("plain", 1, {}), "plain", 1.0),                          # an older verl tool's text
    (({"result": 5, "unit": "m"}, 0.0, {}), '{"result": 5, "unit": "m"}', 0.0),  # a dict without "text": JSON
    (({"text": "t"}, 0.0, {}), "t", 0.0),
    ((42, 0.0, {}), "42", 0.0),
    (("r", 1.0), "r", 1.0),                                    # (response, reward)
])
def test_tool_results_become_text_and_rewards(value, text, reward):
    result, rewards = _call(value)
    assert (result.text, result.failed, result.reward) == (text, False, reward)
    assert rewards == [reward]


@pytest.mark.parametrize("value, text, logged", [
    ({"result": 5}, '{"result": 5}', "execute returned dict, not (response, reward, metrics)"),
    (7, "7", "execute returned int, not (response, reward, metrics)"),
    (("fine", "high", {}), "fine", "execute returned a reward of type str ('high'): counted as 0.0"),
])
def test_odd_shapes_are_used_and_logged_with_the_tool(value, text, logged, caplog):
    with caplog.at_level(logging.WARNING):
        result, rewards = _call(value)
    assert (result.text, result.failed, rewards) == (text, False, [0.0])
    assert f"tool 't': {logged}" in caplog.text


class _Hangs(_Returns):
    async def execute(self, instance_id, parameters, **kwargs):
        await asyncio.sleep(60)


def test_a_hanging_tool_call_is_logged_with_its_arguments(caplog):
    session = ToolSession({"t": _Hangs(None)}, {}, 0.2)
    with caplog.at_level(logging.WARNING):
        result = asyncio.run(session.call(FunctionCall(name="t", arguments={"query": "2+2"})))
    assert (result.text, result.failed) == ("Error: tool 't' timed out after 0.2 s", True)
    assert "tool 't' timed out after 0.2 s on the call {\"query\": \"2+2\"}" in caplog.text
