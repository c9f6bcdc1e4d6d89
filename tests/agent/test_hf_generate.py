"""Agent loops on a real tiny HF model's greedy generation (transformers `generate` on CPU) wrapped as the
async `generate` contract: the model's tokens land in the trajectory exactly as generated, with their
log-probs, and the batch collates."""

import asyncio
import threading

import pytest
import torch
from _agent_doubles import call

from rlpost import keys
from rlpost.agent import AgentLoopConfig, AgentResources, collate_agent_outputs, run_agent_loops
from rlpost.agent.trajectory import encode, render
from rlpost.tools.calculator_tool import CalculatorTool

RESPONSE_LENGTH = 24


class HFGenerate:
    """The async generate contract over `model.generate` (greedy), run in a worker thread so the event
    loop keeps serving other trajectories; one generate at a time on the model."""

    def __init__(self, model, tokenizer):
        self.model, self.tokenizer, self.lock = model, tokenizer, threading.Lock()
        self.prompts = []

    def greedy(self, prompt_ids, max_tokens):
        with self.lock, torch.no_grad():
            out = self.model.generate(
                input_ids=torch.tensor([prompt_ids]), attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
                max_new_tokens=max_tokens, do_sample=False, eos_token_id=self.tokenizer.eos_token_id,
                pad_token_id=self.tokenizer.pad_token_id, return_dict_in_generate=True, output_scores=True,
            )
        ids = out.sequences[0, len(prompt_ids):].tolist()
        log_probs = torch.log_softmax(torch.stack(out.scores, dim=1)[0].float(), -1)
        log_probs = log_probs.gather(-1, torch.tensor(ids).unsqueeze(-1)).squeeze(-1).tolist()
        eos = self.tokenizer.eos_token_id
        n = ids.index(eos) + 1 if eos in ids else len(ids)
        return ids[:n], log_probs[:n]

    async def __call__(self, prompt_ids, sampling_params):
        self.prompts.append(list(prompt_ids))
        return await asyncio.to_thread(self.greedy, prompt_ids, sampling_params["max_tokens"])


class FirstTurnCalls(HFGenerate):
    """First turn of each trajectory: a fixed calculator call; later turns: the real model."""

    async def __call__(self, prompt_ids, sampling_params):
        if self.tokenizer.decode(prompt_ids).count("<|im_start|>assistant") == 1:
            self.prompts.append(list(prompt_ids))
            ids = encode(self.tokenizer, call("calculator", expression="6*7")) + [self.tokenizer.eos_token_id]
            return ids, [0.0] * len(ids)
        return await super().__call__(prompt_ids, sampling_params)


@pytest.fixture(scope="module")
def tiny_model(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, torch_dtype=torch.float32).eval()


MESSAGES = [{"role": "user", "content": "What is 6 * 7?"}]


def test_single_turn_and_tool_agent_keep_the_models_tokens(chat_tokenizer, tiny_model):
    tok = chat_tokenizer
    engine = HFGenerate(tiny_model, tok)
    tools = {"calculator": CalculatorTool({}, None)}
    schemas = [tools["calculator"].tool_schema.model_dump()]
    rows = [{"raw_prompt": MESSAGES, "agent_name": "single_turn_agent"},
            {"raw_prompt": MESSAGES, "agent_name": "tool_agent"}]
    config = AgentLoopConfig(response_length=RESPONSE_LENGTH, tokenization_sanity_check_mode="disable")
    outs = asyncio.run(run_agent_loops(rows, engine, config, tok, {"temperature": 0}, AgentResources(tools)))
    for out, tool_schemas in zip(outs, [None, schemas]):
        prompt = encode(tok, render(tok, MESSAGES, tool_schemas, True))
        expected_ids, expected_lp = engine.greedy(prompt, RESPONSE_LENGTH)
        assert out.prompt_ids == prompt
        assert out.response_ids == expected_ids and out.response_mask == [1] * len(expected_ids)
        assert out.response_logprobs == pytest.approx(expected_lp, abs=1e-5)
        assert all(lp <= 0.0 for lp in out.response_logprobs)
    assert len(outs[1].prompt_ids) > len(outs[0].prompt_ids)  # the tool schemas are in the prompt

    batch = collate_agent_outputs(outs, prompt_length=len(outs[1].prompt_ids), response_length=RESPONSE_LENGTH,
                                  pad_token_id=tok.pad_token_id)
    p = len(outs[1].prompt_ids)
    assert batch[keys.INPUT_IDS].shape == (2, p + RESPONSE_LENGTH)
    assert batch[keys.ROLLOUT_LOG_PROBS].shape == (2, RESPONSE_LENGTH)
    for i, out in enumerate(outs):
        row = batch[keys.INPUT_IDS][i][batch[keys.ATTENTION_MASK][i].bool()].tolist()
        assert row == out.prompt_ids + out.response_ids


def test_model_continues_after_a_tool_result(chat_tokenizer, tiny_model):
    tok = chat_tokenizer
    engine = FirstTurnCalls(tiny_model, tok)
    config = AgentLoopConfig(response_length=144, max_assistant_turns=2, tokenization_sanity_check_mode="disable")
    (out,) = asyncio.run(run_agent_loops([{"raw_prompt": MESSAGES, "agent_name": "tool_agent"}], engine, config, tok,
                                         {"temperature": 0},
                                         AgentResources({"calculator": CalculatorTool({}, None)})))
    first, second = engine.prompts
    call_ids = encode(tok, call("calculator", expression="6*7")) + [tok.eos_token_id]
    delta = encode(tok, "\n<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
    assert second == first + call_ids + delta
    continuation, _ = engine.greedy(second, 144 - len(call_ids) - len(delta))
    assert continuation
    assert out.response_ids == call_ids + delta + continuation
    assert out.response_mask == [1] * len(call_ids) + [0] * len(delta) + [1] * len(continuation)
    assert out.metrics["tool_calls"] == 1.0 and out.metrics["assistant_turns"] == 2.0
