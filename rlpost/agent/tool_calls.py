"""Running one turn's tool calls for one trajectory: concurrently, each under a time-out, every failure
turned into text for the model.

Each trajectory gets one instance per tool it uses (created on first use with the row's
`tools_kwargs[<tool>]["create_kwargs"]`, released when the trajectory ends).
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass, field
from typing import Any

from rlpost.agent.tool_parser import FunctionCall
from rlpost.tools.base_tool import BaseTool
from rlpost.tools.schemas import ToolResponse

logger = logging.getLogger(__name__)


def response_text(response: Any) -> str:
    """Text of what `execute` returned: a ToolResponse, a str, an older verl {"text": ...} dict; any other dict or
    list as JSON (the model reads text), anything else through str()."""
    if isinstance(response, ToolResponse):
        return response.text or ""
    if isinstance(response, dict) and "text" in response:
        return str(response.get("text") or "")
    if isinstance(response, (dict, list)):
        try:
            return json.dumps(response, ensure_ascii=False, default=str)
        except (TypeError, ValueError):
            return str(response)
    return "" if response is None else str(response)


def _split_result(name: str, result: Any) -> tuple[Any, float]:
    """(response, step reward) of what a tool's `execute` returned: verl's (response, reward, metrics) triple, or
    (response, reward); anything else is the response itself with reward 0. A reward that is not a number counts
    0.0; both cases are logged with the tool's name."""
    if isinstance(result, tuple) and len(result) in (2, 3):
        response, reward = result[0], result[1]
    else:
        logger.warning("tool %r: execute returned %s, not (response, reward, metrics): used as the response, "
                       "reward 0", name, type(result).__name__)
        return result, 0.0
    try:
        return response, float(0.0 if reward is None else reward)
    except (TypeError, ValueError):
        logger.warning("tool %r: execute returned a reward of type %s (%r): counted as 0.0", name,
                       type(reward).__name__, reward)
        return response, 0.0


@dataclass
class CallResult:
    """Outcome of one call: the tool message text, whether it failed, and the step reward."""

    text: str
    failed: bool
    reward: float = 0.0


@dataclass
class ToolSession:
    """The tool instances of one trajectory.

    Args:
        tools: {name: tool} of the process.
        tools_kwargs: the row's `tools_kwargs`.
        default_timeout_s: per-call time-out of tools whose config sets no `timeout`.
    """

    tools: dict[str, BaseTool]
    tools_kwargs: dict[str, Any]
    default_timeout_s: float
    _instances: dict[str, asyncio.Task] = field(default_factory=dict)
    step_rewards: list[float] = field(default_factory=list)

    def _instance(self, name: str) -> asyncio.Task:
        """The task creating `name`'s instance, started on first use; parallel calls share it."""
        if name not in self._instances:
            create_kwargs = dict((self.tools_kwargs.get(name) or {}).get("create_kwargs") or {})
            self._instances[name] = asyncio.ensure_future(self.tools[name].create(create_kwargs=create_kwargs))
        return self._instances[name]

    async def _instance_id(self, name: str) -> str:
        # shielded: a call timing out must not cancel the creation other calls of this tool wait on
        created = await asyncio.shield(self._instance(name))
        return created[0] if isinstance(created, tuple) else created  # verl: (id, response); older: id

    async def _execute(self, call: FunctionCall) -> tuple[Any, float, dict]:
        instance_id = await self._instance_id(call.name)
        return await self.tools[call.name].execute(instance_id, call.arguments)

    def timeout_s(self, name: str) -> float:
        return float(self.tools[name].config.get("timeout") or self.default_timeout_s)

    async def call(self, call: FunctionCall) -> CallResult:
        """Run one call; an unknown tool, an exception or a time-out comes back as error text."""
        if call.name not in self.tools:
            return CallResult(f"Error: unknown tool {call.name!r}; available tools: {sorted(self.tools)}", True)
        timeout = self.timeout_s(call.name)
        try:
            response, reward = _split_result(call.name, await asyncio.wait_for(self._execute(call), timeout))
        except asyncio.TimeoutError:  # counted by the agent loop; logged here with the call that hung
            logger.warning("tool %r timed out after %g s on the call %s; the model reads an error and the "
                           "rollout goes on (the tool's `timeout` in its multi_turn.tool_config_path entry sets the "
                           "limit)", call.name, timeout, json.dumps(call.arguments, default=str)[:300])
            return CallResult(f"Error: tool {call.name!r} timed out after {timeout:g} s", True)
        except Exception as e:  # a tool's failure must not end the rollout: the model reads it
            logger.warning("tool %r failed: %s: %s", call.name, type(e).__name__, e)
            return CallResult(f"Error when executing tool {call.name!r}: {type(e).__name__}: {e}", True)
        self.step_rewards.append(reward)
        return CallResult(response_text(response), False, reward)

    async def run(self, calls: list[FunctionCall]) -> list[CallResult]:
        """Run `calls` concurrently; results in call order."""
        return list(await asyncio.gather(*(self.call(c) for c in calls)))

    async def close(self) -> dict[str, float]:
        """`calc_reward` then `release` of every instance created; returns {tool name: reward}. A tool
        failing here is logged and reported as reward 0.0."""
        rewards: dict[str, float] = {}
        for name, task in self._instances.items():
            if not task.done():  # a create still hanging after its calls timed out
                task.cancel()
                continue
            try:
                instance_id = await self._instance_id(name)
            except (Exception, asyncio.CancelledError) as e:  # create failed: the call already reported it
                logger.warning("tool %r: create failed: %s", name, e)
                continue
            try:
                rewards[name] = float(await self.tools[name].calc_reward(instance_id))
            except Exception as e:
                logger.warning("tool %r: calc_reward failed: %s", name, e)
                rewards[name] = 0.0
            try:
                await self.tools[name].release(instance_id)
            except Exception as e:
                logger.warning("tool %r: release failed: %s", name, e)
        self._instances.clear()
        return rewards
