"""`rollout.over_sample_rate` with agent loops: once enough groups have every trajectory finished, the slowest
group's trajectories are cancelled mid-tool (their tools released), and the kept trajectories are exactly those of
a run of the kept rows alone."""

import asyncio
import time

import pytest
from _agent_doubles import ScriptedEngine, SleepTool, call, schema

from rlpost.agent import AgentLoopConfig, AgentResources, run_agent_loops
from rlpost.tools.calculator_tool import CalculatorTool
from rlpost.workers.agent_rollout import placeholder_output

pytestmark = pytest.mark.timeout(60)


def row(marker):
    return {"raw_prompt": [{"role": "user", "content": f"{marker}: what is 12 * 34?"}], "agent_name": "tool_agent"}


def scripts():
    fast = [call("calculator", expression="12*34"), "#### 408"]
    return {"A0": fast, "A1": fast, "B0": fast, "B1": ["#### 408"],
            "C0": [call("slow", tag="C0"), "#### 408"], "C1": ["#### 408"]}  # C1: done in its first turn


def run(tok, markers, log, first_groups=None):
    slow = SleepTool({"sleep_s": 30}, schema("slow"))
    slow.log = log
    resources = AgentResources({"calculator": CalculatorTool({}, None), "slow": slow}, {})
    engine = ScriptedEngine(tok, {m: scripts()[m] for m in markers}, log)
    config = AgentLoopConfig(response_length=400)
    return asyncio.run(run_agent_loops([row(m) for m in markers], engine, config, tok, {"temperature": 0},
                                       resources, first_groups=first_groups))


def test_the_slowest_group_is_cancelled_and_the_kept_rows_are_unchanged(chat_tokenizer):
    tok = chat_tokenizer
    markers = ["A0", "A1", "B0", "B1", "C0", "C1"]
    uids = ["a", "a", "b", "b", "c", "c"]
    log = []
    start = time.monotonic()
    out = run(tok, markers, log, first_groups=(uids, 2))
    assert time.monotonic() - start < 10  # the 30 s tool call was cancelled
    assert out.cut == [False, False, False, False, True, True]
    assert out.aborted == [False, False, False, False, True, False]  # C1 had finished; C0 was in its tool
    assert ("start", "C0") in log and ("end", "C0") not in log and ("release", "slow") in log
    assert out.results[4] is None and out.results[5] is None
    # truth: the four kept rows run alone, without over-sampling
    alone = run(tok, markers[:4], [])
    for got, want in zip(out.results[:4], alone):
        assert (got.prompt_ids, got.response_ids, got.response_mask, got.response_logprobs, got.num_turns) == \
               (want.prompt_ids, want.response_ids, want.response_mask, want.response_logprobs, want.num_turns)
    # a cut row collates as an empty trajectory of the kept rows' conventions
    hole = placeholder_output(out.results)
    assert hole.response_ids == [] and hole.response_logprobs == [] and len(hole.prompt_ids) == 1


def test_all_groups_kept_when_keep_covers_them(chat_tokenizer):
    out = run(chat_tokenizer, ["A0", "B1"], [], first_groups=(["a", "b"], 2))
    assert out.cut == [False, False] and out.aborted == [False, False] and None not in out.results
