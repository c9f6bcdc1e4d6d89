"""A calculator agent loop written against verl's agent-loop API.

It uses only what verl's `AgentLoopBase` offers (`self.server_manager.generate`, `self.apply_chat_template`,
`self.rollout_config`, ...) and verl's tool interface, so the same file runs in verl with its imports saying
`verl`. It is listed in config/agent_loop_config/calculator_agent_loop.yaml and picked with
`actor_rollout_ref.rollout.agent.default_agent_loop=calculator_agent` (examples/multiturn/run_tiny_cpu.sh
with AGENT_LOOP=verl); this folder must be importable by the workers (on PYTHONPATH).

Per trajectory: generate; while the reply holds a `<tool_call>` and turns are left, run the call, append the
result as a tool message (masked out of the loss) and generate again.
"""

import json
import re
from typing import Any
from uuid import uuid4

from rlpost.experimental.agent_loop import AgentLoopBase
from rlpost.experimental.agent_loop.agent_loop import AgentLoopOutput, register
from rlpost.tools.utils.tool_registry import initialize_tools_from_config
from rlpost.utils.profiler import simple_timer

TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


@register("calculator_agent")
class CalculatorAgentLoop(AgentLoopBase):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        multi_turn = self.rollout_config.multi_turn
        self.response_length = self.rollout_config.response_length
        self.max_assistant_turns = multi_turn.max_assistant_turns or 2
        tools = initialize_tools_from_config(multi_turn.tool_config_path)
        self.tools = {tool.name: tool for tool in tools}
        self.tool_schemas = [tool.get_openai_tool_schema().model_dump(exclude_unset=True, exclude_none=True)
                             for tool in tools]

    async def run(self, sampling_params: dict[str, Any], **kwargs) -> AgentLoopOutput:
        messages = list(kwargs["raw_prompt"])
        metrics: dict[str, float] = {}
        request_id = uuid4().hex
        prompt_ids = await self.apply_chat_template(messages, tools=self.tool_schemas)
        response_ids: list[int] = []
        response_mask: list[int] = []
        log_probs: list[float] = []
        turns = tool_turns = 0
        while turns < self.max_assistant_turns and len(response_ids) < self.response_length:
            with simple_timer("generate_sequences", metrics):
                output = await self.server_manager.generate(
                    request_id=request_id, prompt_ids=prompt_ids + response_ids, sampling_params=sampling_params)
            turns += 1
            response_ids += output.token_ids
            response_mask += [1] * len(output.token_ids)
            log_probs += output.log_probs or [0.0] * len(output.token_ids)
            call = self._parse_call(self.tokenizer.decode(output.token_ids, skip_special_tokens=True))
            if call is None or turns == self.max_assistant_turns:
                break
            with simple_timer("tool_calls", metrics):
                result = await self._call_tool(*call, kwargs.get("tools_kwargs") or {})
            tool_ids = await self.apply_chat_template([{"role": "tool", "content": result}], remove_system_prompt=True)
            if len(response_ids) + len(tool_ids) >= self.response_length:
                break
            response_ids += tool_ids
            response_mask += [0] * len(tool_ids)
            log_probs += [0.0] * len(tool_ids)
            tool_turns += 1
        n = self.response_length
        return AgentLoopOutput(
            prompt_ids=prompt_ids,
            response_ids=response_ids[:n],
            response_mask=response_mask[:n],
            response_logprobs=log_probs[:n] if sampling_params.get("logprobs") else None,
            num_turns=1 + turns + tool_turns,  # verl's count: the prompt, the model's turns, the tool turns
            metrics=metrics,
            extra_fields={"tool_rewards": {}, "turn_scores": []},
        )

    def _parse_call(self, text: str) -> tuple[str, dict] | None:
        match = TOOL_CALL.search(text)
        if match is None:
            return None
        try:
            call = json.loads(match.group(1))
        except json.JSONDecodeError:
            return None
        if not isinstance(call, dict) or call.get("name") not in self.tools:
            return None
        return call["name"], call.get("arguments") or {}

    async def _call_tool(self, name: str, arguments: dict, tools_kwargs: dict) -> str:
        tool = self.tools[name]
        create_kwargs = (tools_kwargs.get(name) or {}).get("create_kwargs", {})
        instance_id, _ = await tool.create(create_kwargs=create_kwargs)
        try:
            response, _, _ = await tool.execute(instance_id, arguments)
        finally:
            await tool.release(instance_id)
        return response if isinstance(response, str) else (response.text or "")
