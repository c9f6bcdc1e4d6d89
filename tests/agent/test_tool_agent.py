"""tool_agent driven by scripted engine outputs: tool rounds, parallel calls, time-outs and errors, bad
calls, turn limits, the budget, interactions, and trajectories running concurrently."""

import asyncio
import itertools
import time

import pytest
from _agent_doubles import BoomTool, CountingTool, ScriptedEngine, SleepTool, call, schema

from rlpost.agent import AgentLoopConfig, AgentResources, run_agent_loops
from rlpost.agent.trajectory import encode
from rlpost.interactions.gsm8k_interaction import CORRECT, INCORRECT, Gsm8kInteraction
from rlpost.tools.calculator_tool import CalculatorTool
from rlpost.tools.gsm8k_tool import Gsm8kTool


def row(marker, **extra):
    return {"raw_prompt": [{"role": "user", "content": f"{marker}: what is 12 * 34?"}], "agent_name": "tool_agent",
            **extra}


def run(tok, scripts, tools=None, interactions=None, rows=None, log=None, **cfg):
    engine = ScriptedEngine(tok, scripts, log)
    config = AgentLoopConfig(**{"response_length": 400, **cfg})
    resources = AgentResources(tools or {}, interactions or {})
    outputs = asyncio.run(run_agent_loops(rows or [row(m) for m in scripts], engine, config, tok, {"temperature": 0},
                                          resources))
    return outputs, engine


def texts(tok, out):
    """[(mask, text)] runs of a trajectory's response."""
    res, pos = [], 0
    for value, run_ in itertools.groupby(out.response_mask):
        n = len(list(run_))
        res.append((value, tok.decode(out.response_ids[pos : pos + n], skip_special_tokens=False)))
        pos += n
    return res


def test_calculator_round_trip(chat_tokenizer):
    tok = chat_tokenizer
    calc = CalculatorTool({}, None)
    (out,), engine = run(tok, {"Q": [call("calculator", expression="12*34"), "#### 408"]}, {"calculator": calc},
                         tokenization_sanity_check_mode="strict")
    assert texts(tok, out) == [
        (1, call("calculator", expression="12*34") + "<|im_end|>"),
        (0, "\n<|im_start|>user\n<tool_response>\n408\n</tool_response><|im_end|>\n<|im_start|>assistant\n"),
        (1, "#### 408<|im_end|>"),
    ]
    assert out.metrics == {"assistant_turns": 2.0, "tool_calls": 1.0, "tool_errors": 0.0, "bad_tool_calls": 0.0,
                           "interaction_turns": 0.0, "truncated": 0.0, "tokenization_mismatch": 0.0}
    assert out.num_turns == 4
    # token in: the second request is exactly prompt + first turn + tool delta, asking for the remaining budget
    (_, _, p1, s1), (_, _, p2, s2) = engine.calls
    assert p2 == out.prompt_ids + out.response_ids[: len(p2) - len(out.prompt_ids)]
    assert s1 == {"temperature": 0, "max_tokens": 400}
    assert s2["max_tokens"] == 400 - (len(p2) - len(p1))
    assert out.response_logprobs == [-0.1 if m else 0.0 for m in out.response_mask]
    assert "calculator" in tok.decode(out.prompt_ids)  # the schemas reach the template


def test_parallel_calls_run_concurrently_and_are_capped(chat_tokenizer):
    tok = chat_tokenizer
    sleep = SleepTool({"sleep_s": 0.05}, schema("sleep"))
    sleep.log = []
    three = call("sleep", tag="a") + call("sleep", tag="b") + call("sleep", tag="c")
    (out,), _ = run(tok, {"Q": [three, "done"]}, {"sleep": sleep}, max_parallel_calls=2)
    assert sleep.log == [("start", "a"), ("start", "b"), ("end", "a"), ("end", "b"), ("release", "sleep")]
    assert out.metrics["tool_calls"] == 2.0
    assert "slept a\n</tool_response>\n<tool_response>\nslept b" in texts(tok, out)[1][1]


def test_timeouts_errors_and_unknown_tools_go_back_as_text(chat_tokenizer):
    tok = chat_tokenizer
    slow = SleepTool({"sleep_s": 30, "timeout": 0.05}, schema("slow"))
    slow.log = []
    tools = {"slow": slow, "boom": BoomTool({}, schema("boom"))}
    calls = call("slow") + call("boom") + call("nope")
    (out,), engine = run(tok, {"Q": [calls, "giving up"]}, tools, max_parallel_calls=3, response_length=1500)
    delta = texts(tok, out)[1][1]
    assert "Error: tool 'slow' timed out after 0.05 s" in delta
    assert "Error when executing tool 'boom': RuntimeError: kaboom" in delta
    assert "Error: unknown tool 'nope'; available tools: ['boom', 'slow']" in delta
    assert out.metrics["tool_calls"] == 3.0 and out.metrics["tool_errors"] == 3.0
    assert len(engine.calls) == 2 and texts(tok, out)[-1] == (1, "giving up<|im_end|>")  # the rollout went on


def test_bad_call_is_counted_and_kept_as_text(chat_tokenizer):
    tok = chat_tokenizer
    bad = '<tool_call>{"name": "calculator", "arguments": {</tool_call>'
    (out,), engine = run(tok, {"Q": [bad]}, {"calculator": CalculatorTool({}, None)})
    assert texts(tok, out) == [(1, bad + "<|im_end|>")]
    assert out.metrics["bad_tool_calls"] == 1.0 and out.metrics["tool_calls"] == 0.0
    assert len(engine.calls) == 1


def test_turn_limits(chat_tokenizer):
    tok = chat_tokenizer
    tools = {"calculator": CalculatorTool({}, None)}
    looping = {"Q": [call("calculator", expression="1+1")] * 5}
    (out,), engine = run(tok, looping, tools, max_assistant_turns=1)
    assert len(engine.calls) == 1 and out.metrics["tool_calls"] == 0.0 and out.num_turns == 2
    (out,), engine = run(tok, looping, tools, max_user_turns=2)
    assert len(engine.calls) == 3 and out.metrics["tool_calls"] == 2.0 and out.num_turns == 6
    assert out.response_mask[-1] == 1


def test_budget_is_never_exceeded(chat_tokenizer):
    tok = chat_tokenizer
    tools = {"calculator": CalculatorTool({}, None)}
    first = encode(tok, call("calculator", expression="1+1")) + [tok.eos_token_id]
    for budget in (len(first) - 3, len(first) + 5, len(first) + 40):
        (out,), engine = run(tok, {"Q": [call("calculator", expression="1+1")] * 9}, tools, response_length=budget)
        assert len(out.response_ids) <= budget and out.response_mask[-1] == 1
        assert out.metrics["truncated"] == 1.0
        assert all(c[3]["max_tokens"] <= budget for c in engine.calls)


def test_tool_instance_per_trajectory_with_create_kwargs(chat_tokenizer):
    tok = chat_tokenizer
    counting = CountingTool({}, schema("count"))
    rows = [row("Q", tools_kwargs={"count": {"create_kwargs": {"seed": 7}}})]
    (out,), _ = run(tok, {"Q": [call("count", n=2) + call("count", n=3), call("count"), "end"]},
                    {"count": counting}, rows=rows, max_parallel_calls=2)
    assert counting.events == [
        ("create", "inst1", {"create_kwargs": {"seed": 7}}),
        ("execute", "inst1", {"n": 2}), ("execute", "inst1", {"n": 3}), ("execute", "inst1", {}),
        ("release", "inst1"),
    ]
    assert out.extra_fields["tool_rewards"] == {"count": 2.0}
    assert out.extra_fields["step_rewards"] == [0.5, 0.5, 0.5]


def test_gsm8k_tool_rewards_through_the_loop(chat_tokenizer):
    tok = chat_tokenizer
    tool = Gsm8kTool({}, None)
    rows = [row("Q", extra_info={"tools_kwargs": {"calc_gsm8k_reward": {"create_kwargs": {"ground_truth": "408"}}}})]
    script = {"Q": [call("calc_gsm8k_reward", answer="407"), call("calc_gsm8k_reward", answer="408"), "#### 408"]}
    (out,), _ = run(tok, script, {"calc_gsm8k_reward": tool}, rows=rows)
    assert out.extra_fields["step_rewards"] == [-0.05, 0.0]
    assert out.extra_fields["tool_rewards"] == {"calc_gsm8k_reward": 1.0}
    assert tool._instances == {}


def test_interaction_retry_then_done(chat_tokenizer):
    tok = chat_tokenizer
    rows = [row("Q", extra_info={"interaction_kwargs": {"name": "gsm8k", "ground_truth": "408"}})]
    grader = Gsm8kInteraction({"name": "gsm8k"})
    (out,), _ = run(tok, {"Q": ["#### 407", "#### 408", "unused"]}, interactions={"gsm8k": grader}, rows=rows,
                    tokenization_sanity_check_mode="strict")
    assert texts(tok, out) == [
        (1, "#### 407<|im_end|>"),
        (0, f"\n<|im_start|>user\n{INCORRECT}<|im_end|>\n<|im_start|>assistant\n"),
        (1, "#### 408<|im_end|>"),
    ]
    assert out.extra_fields["turn_scores"] == [0.0, 1.0]
    assert out.metrics["interaction_turns"] == 2.0 and out.metrics["tokenization_mismatch"] == 0.0
    assert out.num_turns == 4  # prompt, 2 model turns, 1 user turn (the terminating reply is not appended)
    assert CORRECT not in tok.decode(out.response_ids) and grader._instances == {}


def test_unknown_interaction_is_refused_before_running(chat_tokenizer):
    rows = [row("Q", extra_info={"interaction_kwargs": {"name": "judge"}})]
    with pytest.raises(ValueError, match=r"\['judge'\] are not configured interactions; configured: \['gsm8k'\]"):
        run(chat_tokenizer, {"Q": ["x"]}, interactions={"gsm8k": Gsm8kInteraction({})}, rows=rows)


def test_trajectories_run_concurrently(chat_tokenizer):
    """A waits 0.3 s on its tool; B, which started after A, finishes all its turns meanwhile."""
    tok = chat_tokenizer
    log = []
    slow = SleepTool({"sleep_s": 0.3}, schema("slow"))
    slow.log = log
    scripts = {"A": [call("slow", tag="A"), "A done"], "B": [call("calculator", expression="1+1"), "B done"]}
    outs, _ = run(tok, scripts, {"slow": slow, "calculator": CalculatorTool({}, None)}, rows=[row("A"), row("B")],
                  log=log)
    assert log.index(("generate", "B", 1)) < log.index(("end", "A")) < log.index(("generate", "A", 1))
    assert log.index(("generate", "A", 0)) < log.index(("generate", "B", 0))
    assert [texts(tok, o)[-1] for o in outs] == [(1, "A done<|im_end|>"), (1, "B done<|im_end|>")]


def test_a_failing_trajectory_stops_the_others_and_releases_their_tools(chat_tokenizer):
    tok = chat_tokenizer
    log = []
    slow = SleepTool({"sleep_s": 30}, schema("slow"))
    slow.log = log
    scripts = {"A": [call("slow", tag="A"), "A done"],
               "B": [call("calculator", expression="1+1"), RuntimeError("engine down")]}
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="engine down"):
        run(tok, scripts, {"slow": slow, "calculator": CalculatorTool({}, None)}, rows=[row("A"), row("B")], log=log)
    assert time.monotonic() - start < 10
    assert ("start", "A") in log and ("end", "A") not in log and ("release", "slow") in log
