"""Test doubles of the agent tests: a scripted ENGINE output (a random tiny model never emits tool calls)
and tools that sleep, raise or record. Everything else in these tests is real."""

from __future__ import annotations

import asyncio
from typing import Any

from rlpost.agent.trajectory import encode
from rlpost.tools.base_tool import BaseTool
from rlpost.tools.schemas import ToolResponse


def schema(name: str) -> dict:
    return {"type": "function", "function": {"name": name, "description": name, "parameters": {
        "type": "object", "properties": {}, "required": []}}}


def call(name: str, **arguments: Any) -> str:
    import json

    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


class ScriptedEngine:
    """Async `generate` replying with fixed texts: the row is found by a marker in the prompt text, the turn
    by the number of assistant headers in it. Replies end with EOS and are cut to `max_tokens`; log-probs
    are -0.1 per token; an Exception in the script is raised instead. Every call is recorded as
    (marker, turn, prompt_ids, sampling_params)."""

    def __init__(self, tokenizer: Any, scripts: dict[str, list[str]], log: list | None = None) -> None:
        self.tokenizer, self.scripts = tokenizer, scripts
        self.calls: list[tuple[str, int, list[int], dict]] = []
        self.log = log if log is not None else []

    async def __call__(self, prompt_ids: list[int], sampling_params: dict) -> tuple[list[int], list[float]]:
        text = self.tokenizer.decode(prompt_ids, skip_special_tokens=False)
        marker = next(m for m in self.scripts if m in text)
        turn = text.count("<|im_start|>assistant") - 1
        self.calls.append((marker, turn, list(prompt_ids), dict(sampling_params)))
        self.log.append(("generate", marker, turn))
        await asyncio.sleep(0)  # yield like a real engine would
        reply = self.scripts[marker][turn]
        if isinstance(reply, Exception):
            raise reply
        ids = encode(self.tokenizer, reply) + [self.tokenizer.eos_token_id]
        ids = ids[: sampling_params["max_tokens"]]
        return ids, [-0.1] * len(ids)


class SleepTool(BaseTool):
    """Sleeps `config["sleep_s"]` seconds per call, recording start, end and release in `log`."""

    log: list = []

    async def execute(self, instance_id: str, parameters: dict, **kwargs: Any) -> tuple[ToolResponse, float, dict]:
        tag = parameters.get("tag", self.name)
        self.log.append(("start", tag))
        await asyncio.sleep(float(self.config["sleep_s"]))
        self.log.append(("end", tag))
        return ToolResponse(text=f"slept {tag}"), 0.0, {}

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        self.log.append(("release", self.name))


class BoomTool(BaseTool):
    """Raises on every call."""

    async def execute(self, instance_id: str, parameters: dict, **kwargs: Any) -> tuple[ToolResponse, float, dict]:
        raise RuntimeError("kaboom")


class CountingTool(BaseTool):
    """Records create/execute/release with instance ids and create kwargs; answers with the call count."""

    def __init__(self, config: dict, tool_schema: Any) -> None:
        super().__init__(config, tool_schema)
        self.events: list[tuple] = []
        self.count = 0

    async def create(self, instance_id: str | None = None, **kwargs: Any) -> tuple[str, ToolResponse]:
        self.count += 1
        iid = f"inst{self.count}"
        self.events.append(("create", iid, kwargs))
        return iid, ToolResponse()

    async def execute(self, instance_id: str, parameters: dict, **kwargs: Any) -> tuple[str, float, dict]:
        self.events.append(("execute", instance_id, parameters))
        return "x" * int(parameters.get("n", 1)), 0.5, {}

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        return 2.0

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        self.events.append(("release", instance_id))
