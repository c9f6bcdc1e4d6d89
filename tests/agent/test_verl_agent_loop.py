"""Agent loops written against verl's API (`rlpost.experimental.agent_loop`) run in the rollout worker's
multi-turn path: verl's attributes, `server_manager.generate`, `apply_chat_template`, the older `init_class`
hook, and the output's metrics. The engine is scripted (a random tiny model says nothing useful); the loops,
the worker's `AgentRollout`, the tokenizer and the collation are real. The whole path through `main_ppo` is
tests/trainer/ppo/test_multiturn_e2e.py::test_grpo_with_an_agent_loop_written_for_verl."""

import asyncio
from typing import Any
from uuid import uuid4

import numpy as np
import pytest
import torch

from _compose import SMALL, compose_config
from rlpost import keys
from rlpost.experimental.agent_loop import AgentLoopBase, AgentLoopMetrics, AsyncLLMServerManager
from rlpost.experimental.agent_loop.agent_loop import AgentLoopOutput, register
from rlpost.protocol import DataProto
from rlpost.rollout.async_engine import AgentEngine, spec_of
from rlpost.rollout.base import BaseRollout
from rlpost.utils.profiler import simple_timer
from rlpost.utils.rollout_trace import rollout_trace_op
from rlpost.workers.agent_rollout import AgentRollout

P, R = 64, 48


class TwoTurnAgentLoop(AgentLoopBase):
    """Written as verl's loops are: answer, get a user nudge, answer again; the nudge is masked out."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.response_length = self.config.actor_rollout_ref.rollout.response_length
        self.nudge = kwargs.get("nudge", "Check it.")

    @rollout_trace_op
    async def run(self, sampling_params: dict[str, Any], **kwargs) -> AgentLoopOutput:
        messages = list(kwargs["raw_prompt"])
        metrics: dict[str, Any] = {}
        request_id = uuid4().hex
        prompt_ids = await self.apply_chat_template(messages)
        response_ids, response_mask, log_probs = [], [], []
        for turn in range(2):
            with simple_timer("generate_sequences", metrics):
                output = await self.server_manager.generate(
                    request_id=request_id, prompt_ids=prompt_ids + response_ids, sampling_params=sampling_params)
            response_ids += output.token_ids
            response_mask += [1] * len(output.token_ids)
            log_probs += output.log_probs
            if turn == 0:
                nudge = await self.apply_chat_template([{"role": "user", "content": self.nudge}],
                                                       remove_system_prompt=True)
                response_ids += nudge
                response_mask += [0] * len(nudge)
                log_probs += [0.0] * len(nudge)
        n = self.response_length
        return AgentLoopOutput(prompt_ids=prompt_ids, response_ids=response_ids[:n], response_mask=response_mask[:n],
                               response_logprobs=log_probs[:n], num_turns=4, metrics=metrics,
                               extra_fields={"turn_scores": [0.5]})


class InitClassAgentLoop(AgentLoopBase):
    """verl's older style: shared settings stored on the class by `init_class`, once."""

    calls = 0

    @classmethod
    def init_class(cls, config, tokenizer, processor, **kwargs):
        if cls._class_initialized:
            return
        cls._class_initialized = True
        cls.calls += 1
        cls.tokenizer = tokenizer
        cls.max_turns = config.actor_rollout_ref.rollout.multi_turn.max_assistant_turns
        cls.response_length = config.actor_rollout_ref.rollout.response_length

    async def run(self, sampling_params, **kwargs):
        prompt_ids = await self.apply_chat_template(list(kwargs["raw_prompt"]))
        out = await self.server_manager.generate(request_id="r", prompt_ids=prompt_ids,
                                                 sampling_params={**sampling_params, "max_tokens": 5})
        return AgentLoopOutput(prompt_ids=prompt_ids, response_ids=out.token_ids, response_mask=[1] * len(out.token_ids),
                               response_logprobs=out.log_probs, num_turns=2,
                               metrics=AgentLoopMetrics(generate_sequences=0.25), reward_score=float(self.max_turns))


@pytest.fixture(scope="module", autouse=True)
def registered_loops():
    """The two loops, registered with verl's decorator for this module's tests only (the registry is the
    process's: other tests list its names)."""
    from rlpost.agent import AGENT_LOOPS

    register("verl_two_turn_test_agent")(TwoTurnAgentLoop)
    register("verl_init_class_test_agent")(InitClassAgentLoop)
    yield
    for name in ("verl_two_turn_test_agent", "verl_init_class_test_agent"):
        AGENT_LOOPS._entries.pop(name, None)


class CountingEngine(AgentEngine):
    """Replies `ok` + EOS (cut to max_tokens), log-probs -0.5; records each prompt and max_tokens."""

    def __init__(self, tokenizer):
        self.tokenizer, self.calls = tokenizer, []

    async def generate(self, prompt_ids, sampling_params):
        spec = spec_of(sampling_params)
        self.calls.append((list(prompt_ids), spec.max_tokens))
        await asyncio.sleep(0)
        ids = (self.tokenizer.encode("ok", add_special_tokens=False) + [self.tokenizer.eos_token_id])[:spec.max_tokens]
        return ids, [-0.5] * len(ids)


class Rollout(BaseRollout):
    def __init__(self, tokenizer):
        self.tokenizer, self.engine = tokenizer, None

    def agent_engine(self, stop_ids):
        self.engine = CountingEngine(self.tokenizer)
        return self.engine

    def generate_sequences(self, prompts):
        raise AssertionError("multi-turn rows never take the single-turn path")

    def update_weights(self, named_tensors):
        pass


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir, padding_side="left")


def worker_rollout(tokenizer, *overrides):
    arr = compose_config(*SMALL, f"data.max_prompt_length={P}", f"data.max_response_length={R}",
                         "actor_rollout_ref.rollout.multi_turn.enable=true",
                         "actor_rollout_ref.rollout.calculate_log_probs=true", *overrides).actor_rollout_ref
    return AgentRollout(arr.rollout, tokenizer, arr_config=arr)


def prompts(tokenizer, agent_names):
    n = len(agent_names)
    raw = np.empty(n, dtype=object)
    raw[:] = [[{"role": "user", "content": f"q{i}"}] for i in range(n)]
    names = np.empty(n, dtype=object)
    names[:] = agent_names
    return DataProto.from_dict(
        tensors={keys.INPUT_IDS: torch.zeros(n, 2, dtype=torch.long), keys.ATTENTION_MASK: torch.ones(n, 2),
                 keys.POSITION_IDS: torch.zeros(n, 2, dtype=torch.long)},
        non_tensors={keys.RAW_PROMPT: raw, keys.AGENT_NAME: names},
        meta_info={keys.META_EOS_TOKEN_ID: tokenizer.eos_token_id, keys.META_PAD_TOKEN_ID: tokenizer.pad_token_id,
                   keys.META_CHAT_TEMPLATE_KWARGS: {}})


def test_a_verl_loop_runs_in_the_worker_and_its_turns_are_masked(tokenizer):
    rollout = Rollout(tokenizer)
    out = worker_rollout(tokenizer).generate_sequences(rollout, prompts(tokenizer, ["verl_two_turn_test_agent"] * 2))
    ok = tokenizer.encode("ok", add_special_tokens=False) + [tokenizer.eos_token_id]
    nudge = tokenizer.encode("<|im_start|>user\nCheck it.<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
    b = out.batch
    for row in range(2):
        n = int(b[keys.ATTENTION_MASK][row, P:].sum())
        assert b[keys.RESPONSES][row, :n].tolist() == ok + nudge + ok
        assert b[keys.RESPONSE_MASK][row, :n].tolist() == [1] * len(ok) + [0] * len(nudge) + [1] * len(ok)
        assert b[keys.ROLLOUT_LOG_PROBS][row, :n].tolist() == [-0.5] * len(ok) + [0.0] * len(nudge) + [-0.5] * len(ok)
        prompt = tokenizer.decode(b[keys.PROMPTS][row][b[keys.ATTENTION_MASK][row, :P].bool()])
        assert prompt == f"<|im_start|>user\nq{row}<|im_end|>\n<|im_start|>assistant\n"
    # verl's server manager: the rollout's max_tokens, cut to what the engine's P + R context leaves
    first, second = rollout.engine.calls[0], rollout.engine.calls[1]
    assert first[1] == R and second[1] == min(R, P + R - len(second[0]))
    nt = out.non_tensor_batch
    assert nt[keys.NUM_TURNS].tolist() == [4, 4] and list(nt[keys.TURN_SCORES][0]) == [0.5]
    metrics = nt[keys.AGENT_METRICS][0]
    assert metrics["generate_s"] > 0 and "generate_sequences" not in metrics and "tool_calls" not in metrics


def test_init_class_runs_once_and_the_output_metrics_are_renamed(tokenizer):
    InitClassAgentLoop._class_initialized, InitClassAgentLoop.calls = False, 0  # class state lives per process
    rollout = Rollout(tokenizer)
    out = worker_rollout(tokenizer, "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=3").generate_sequences(
        rollout, prompts(tokenizer, ["verl_init_class_test_agent"] * 3))
    assert InitClassAgentLoop.calls == 1 and InitClassAgentLoop.max_turns == 3
    assert InitClassAgentLoop.response_length == R
    assert [c[1] for c in rollout.engine.calls] == [5, 5, 5]  # the loop's own max_tokens
    assert out.batch[keys.RM_SCORES].sum(-1).tolist() == [3.0, 3.0, 3.0]  # the loop's reward_score
    assert out.non_tensor_batch[keys.AGENT_METRICS][0] == {"generate_s": 0.25, "tool_calls_s": 0.0,
                                                           "compute_score_s": 0.0, "num_preempted": -1.0}


def test_the_trainer_view_is_read_only_and_holds_the_worker_group(tokenizer):
    from rlpost.agent.config import AgentLoopConfig

    wr = worker_rollout(tokenizer)
    view = wr.trainer_view(AgentLoopConfig(response_length=R, template_kwargs={"enable_thinking": False}))
    assert view.data.max_prompt_length == P and view.data.apply_chat_template_kwargs == {"enable_thinking": False}
    assert view.actor_rollout_ref.rollout.response_length == R and "actor" in view.actor_rollout_ref
    with pytest.raises(Exception, match="read-only"):
        view.data.max_prompt_length = 1


def test_what_is_not_supported_is_named():
    async def generate(prompt_ids, params):
        return [1], None

    manager = AsyncLLMServerManager(generate, context_length=8)
    with pytest.raises(ValueError, match=r"not supported yet: generate\(image_data=...\)"):
        asyncio.run(manager.generate("r", prompt_ids=[1], sampling_params={}, image_data=[object()]))
    with pytest.raises(ValueError, match=r"not supported yet: sampling_params \['stop'\]"):
        asyncio.run(manager.generate("r", prompt_ids=[1], sampling_params={"stop": ["\n"], "top_p": 1.0}))
    with pytest.raises(ValueError, match=r"not supported yet: sampling_params\['repetition_penalty'\]=1.1"):
        asyncio.run(manager.generate("r", prompt_ids=[1], sampling_params={"repetition_penalty": 1.1}))
    with pytest.raises(ValueError, match="a conversation of 8 tokens leaves no room in the engine's 8"):
        asyncio.run(manager.generate("r", prompt_ids=[1] * 8, sampling_params={}))
    out = asyncio.run(manager.generate("r", prompt_ids=[1] * 5, sampling_params={"max_new_tokens": 9,
                                                                                   "repetition_penalty": 1.0}))
    assert out.token_ids == [1] and out.log_probs is None
    with pytest.raises(ValueError, match="not supported yet: AgentLoopOutput.multi_modal_data"):
        AgentLoopOutput(prompt_ids=[1], response_ids=[2], response_mask=[1], multi_modal_data={"image": [1]})


def test_a_verl_loop_outside_the_rollout_worker_is_told_what_it_needs(tokenizer):
    from rlpost.agent import AgentLoopConfig, run_agent_loops

    async def generate(prompt_ids, params):
        return [1], None

    rows = [{keys.RAW_PROMPT: [{"role": "user", "content": "q"}], keys.AGENT_NAME: "verl_two_turn_test_agent"}]
    with pytest.raises(RuntimeError, match="needs the trainer view"):
        asyncio.run(run_agent_loops(rows, generate, AgentLoopConfig(response_length=R), tokenizer))


def test_a_yaml_entry_gives_a_decorated_loop_its_keyword_arguments(tmp_path, tokenizer):
    """verl's pattern: `@register(name)` on the class and an agent_loop_config_path entry of the same name with
    constructor arguments; the entry's arguments reach the loop."""
    from rlpost.agent import AGENT_LOOPS, load_agent_loops

    path = tmp_path / "loops.yaml"
    path.write_text("- name: verl_two_turn_test_agent\n"
                    f"  _target_: {__name__}.TwoTurnAgentLoop\n  nudge: Try again.\n")
    before = AGENT_LOOPS.get("verl_two_turn_test_agent")
    try:
        assert load_agent_loops(path) == ["verl_two_turn_test_agent"]
        rollout = Rollout(tokenizer)
        out = worker_rollout(tokenizer).generate_sequences(rollout, prompts(tokenizer, ["verl_two_turn_test_agent"]))
        n = int(out.batch[keys.ATTENTION_MASK][0, P:].sum())
        assert "Try again." in tokenizer.decode(out.batch[keys.RESPONSES][0, :n])
    finally:
        AGENT_LOOPS._entries["verl_two_turn_test_agent"] = before


def test_agent_loop_output_as_dict_is_a_copy_of_every_field():
    out = AgentLoopOutput(prompt_ids=[1, 2], response_ids=[3, 4], response_mask=[1, 0], num_turns=3,
                          metrics=AgentLoopMetrics(generate_sequences=0.5), extra_fields={"turn_scores": [1.0]})
    d = out.as_dict()
    assert d["prompt_ids"] == [1, 2] and d["response_mask"] == [1, 0] and d["num_turns"] == 3
    assert d["extra_fields"] == {"turn_scores": [1.0]} and d["response_logprobs"] is None
    assert d["metrics"] == out.metrics and set(d) >= {"routed_experts", "multi_modal_data", "reward_score"}
    d["response_ids"].append(9)
    assert out.response_ids == [3, 4]
