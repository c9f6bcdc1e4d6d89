"""The rollout worker's multi-turn path: rows run their agent loops on the rollout's agent front and come back
as single-turn batch fields plus per-row counters; tool tokens are masked out of `response_mask`.

The engine here is scripted (a random tiny model never calls a tool): its first turn of every row is a
calculator call, its second an answer. The real engines behind `agent_engine` are tested in
tests/rollout/test_async_engine.py, the whole path in tests/trainer/ppo/test_multiturn_e2e.py.
"""

import asyncio

import numpy as np
import pytest
import torch

from _compose import SMALL, compose_config
from rlpost import keys
from rlpost.protocol import DataProto
from rlpost.rollout.async_engine import AgentEngine, spec_of
from rlpost.rollout.base import BaseRollout
from rlpost.workers.agent_rollout import AgentRollout

P, R = 512, 192
CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "6*7"}}</tool_call>'


class ScriptedEngine(AgentEngine):
    """Turn 1: a calculator call; turn 2: `#### <last tool result>`; log-probs -0.5 each."""

    def __init__(self, tokenizer, stop_ids):
        self.tokenizer, self.stop_ids, self.prompts, self.closed = tokenizer, stop_ids, [], False

    async def generate(self, prompt_ids, sampling_params):
        spec = spec_of(sampling_params)
        self.prompts.append(list(prompt_ids))
        await asyncio.sleep(0)
        text = self.tokenizer.decode(prompt_ids)
        reply = CALL if "<tool_response>" not in text else "#### " + text.split("<tool_response>\n")[-1].split("\n")[0]
        ids = (self.tokenizer.encode(reply, add_special_tokens=False) + [self.tokenizer.eos_token_id])[:spec.max_tokens]
        return ids, ([-0.5] * len(ids) if spec.logprobs else None)

    async def close(self):
        self.closed = True


class ScriptedRollout(BaseRollout):
    def __init__(self, tokenizer):
        self.tokenizer, self.engines = tokenizer, []

    def agent_engine(self, stop_ids):
        self.engines.append(ScriptedEngine(self.tokenizer, stop_ids))
        return self.engines[-1]

    def generate_sequences(self, prompts):
        raise AssertionError("the multi-turn path must not call the single-turn generation")

    def update_weights(self, named_tensors):
        pass


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir, padding_side="left")


def rollout_config(tmp_path, *overrides):
    tools = tmp_path / "tools.yaml"
    tools.write_text("tools:\n  - class_name: rlpost.tools.calculator_tool.CalculatorTool\n"
                     "    config: {type: native}\n")
    return compose_config(*SMALL, f"data.max_prompt_length={P}", f"data.max_response_length={R}",
                          "actor_rollout_ref.rollout.multi_turn.enable=true",
                          f"actor_rollout_ref.rollout.multi_turn.tool_config_path={tools}", *overrides
                          ).actor_rollout_ref.rollout


def objects(values):
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


def prompts_of(tokenizer, questions, agent_names, **meta):
    n = len(questions)
    ids = torch.full((n, 4), tokenizer.pad_token_id)  # the single-turn tensors; the agent loops re-render
    return DataProto.from_dict(
        tensors={keys.INPUT_IDS: ids, keys.ATTENTION_MASK: torch.ones(n, 4, dtype=torch.long),
                 keys.POSITION_IDS: torch.arange(4).expand(n, 4)},
        non_tensors={keys.RAW_PROMPT: objects([[{"role": "user", "content": q}] for q in questions]),
                     keys.AGENT_NAME: objects(agent_names), keys.UID: objects([f"u{i}" for i in range(n)]),
                     keys.TOOLS_KWARGS: objects([{}] * n), keys.INTERACTION_KWARGS: objects([{}] * n)},
        meta_info={keys.META_EOS_TOKEN_ID: tokenizer.eos_token_id, keys.META_PAD_TOKEN_ID: tokenizer.pad_token_id,
                   keys.META_CHAT_TEMPLATE_KWARGS: {}, **meta})


def test_tool_turns_are_masked_and_counted(tokenizer, tmp_path):
    cfg = rollout_config(tmp_path, "actor_rollout_ref.rollout.calculate_log_probs=true")
    worker_rollout = AgentRollout(cfg, tokenizer)
    rollout = ScriptedRollout(tokenizer)
    out = worker_rollout.generate_sequences(rollout, prompts_of(tokenizer, ["What is 6*7?", "Hi"],
                                                                 ["tool_agent", "tool_agent"]))
    engine = rollout.engines[0]
    assert engine.closed and len(engine.prompts) == 4  # two turns per row
    b = out.batch
    assert b[keys.PROMPTS].shape == (2, P) and b[keys.RESPONSES].shape == (2, R)
    assert b[keys.INPUT_IDS].shape == (2, P + R) and b[keys.ROLLOUT_LOG_PROBS].shape == (2, R)
    call_ids = tokenizer.encode(CALL, add_special_tokens=False) + [tokenizer.eos_token_id]
    answer_ids = tokenizer.encode("#### 42", add_special_tokens=False) + [tokenizer.eos_token_id]
    for row in range(2):
        mask, resp = b[keys.RESPONSE_MASK][row], b[keys.RESPONSES][row]
        n = int(b[keys.ATTENTION_MASK][row, P:].sum())
        tool_len = n - len(call_ids) - len(answer_ids)
        assert resp[:len(call_ids)].tolist() == call_ids and resp[n - len(answer_ids):n].tolist() == answer_ids
        assert mask[:n].tolist() == [1] * len(call_ids) + [0] * tool_len + [1] * len(answer_ids)
        assert "<tool_response>\n42\n</tool_response>" in tokenizer.decode(resp[len(call_ids):n - len(answer_ids)])
        assert b[keys.ROLLOUT_LOG_PROBS][row, :n].tolist() == [-0.5 * m for m in mask[:n].tolist()]
        assert mask[n:].sum() == 0 and b[keys.ROLLOUT_LOG_PROBS][row, n:].abs().sum() == 0
    nt = out.non_tensor_batch
    assert list(nt[keys.UID]) == ["u0", "u1"]  # input fields carried through
    assert nt[keys.NUM_TURNS].tolist() == [4, 4]  # prompt, call, tool result, answer
    assert nt[keys.AGENT_METRICS][0]["tool_calls"] == 1.0 and nt[keys.AGENT_METRICS][0]["truncated"] == 0.0
    assert nt[keys.TOOL_REWARDS][0] == {"calculator": 0.0} and nt[keys.TURN_SCORES][0] == []
    # the prompt the engine saw first is the left-padded prompt row: the chat with the calculator schema
    first_prompt = engine.prompts[0]
    assert b[keys.PROMPTS][0, P - len(first_prompt):].tolist() == first_prompt
    assert "calculator" in tokenizer.decode(first_prompt)


def test_without_log_probs_and_single_turn_rows(tokenizer, tmp_path):
    worker_rollout = AgentRollout(rollout_config(tmp_path), tokenizer)
    out = worker_rollout.generate_sequences(ScriptedRollout(tokenizer),
                                            prompts_of(tokenizer, ["What is 6*7?"], ["single_turn_agent"]))
    assert keys.ROLLOUT_LOG_PROBS not in out.batch
    assert out.non_tensor_batch[keys.NUM_TURNS].tolist() == [2]  # one model turn: the call is not run
    assert out.non_tensor_batch[keys.AGENT_METRICS][0]["tool_calls"] == 0.0


def test_prompt_longer_than_max_prompt_length_names_the_key(tokenizer, tmp_path):
    cfg = rollout_config(tmp_path)
    worker_rollout = AgentRollout(cfg, tokenizer)
    long_question = "What is 6*7? " * 300
    with pytest.raises(ValueError, match=f"longer than data.max_prompt_length={P} once rendered for the agent "
                                         "loop"):
        worker_rollout.generate_sequences(ScriptedRollout(tokenizer),
                                          prompts_of(tokenizer, [long_question], ["tool_agent"]))


def test_unknown_agent_name_fails_before_any_generation(tokenizer, tmp_path):
    rollout = ScriptedRollout(tokenizer)
    with pytest.raises(ValueError, match=r"agent_name values \['nope'\] are not registered"):
        AgentRollout(rollout_config(tmp_path), tokenizer).generate_sequences(
            rollout, prompts_of(tokenizer, ["Hi"], ["nope"]))
    assert rollout.engines[0].prompts == [] and rollout.engines[0].closed


def test_hf_engine_runs_the_agent_loops(tokenizer, tmp_path, tiny_model_dir):
    """The real HF rollout behind the agent front: greedy, one row per agent loop kind; the tokens equal
    `HFRollout.generate` on the rendered prompt."""
    from transformers import AutoModelForCausalLM

    from rlpost.rollout import build_rollout

    cfg = rollout_config(tmp_path, "actor_rollout_ref.rollout.name=hf")
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    hf = build_rollout(cfg, tiny_model_dir, tokenizer, "cpu", module=model)
    out = AgentRollout(cfg, tokenizer).generate_sequences(
        hf, prompts_of(tokenizer, ["What is 6*7?", "What is 6*7?"], ["tool_agent", "single_turn_agent"],
                       do_sample=False))
    for row in range(2):
        n_prompt = int(out.batch[keys.ATTENTION_MASK][row, :P].sum())
        prompt = out.batch[keys.PROMPTS][row, P - n_prompt:]
        n = int(out.batch[keys.ATTENTION_MASK][row, P:].sum())
        expected = hf.generate(prompt.unsqueeze(0), torch.ones(1, n_prompt, dtype=torch.long),
                               spec_of_greedy(cfg), {tokenizer.eos_token_id}, tokenizer.pad_token_id)[0][0]
        assert out.batch[keys.RESPONSES][row, :n].tolist() == expected[:n]
        assert out.batch[keys.RESPONSE_MASK][row, :n].sum() == n  # no tool call: every token is the model's


def spec_of_greedy(cfg):
    from rlpost.rollout.base import resolve_sampling

    return resolve_sampling(cfg, {keys.META_DO_SAMPLE: False})
