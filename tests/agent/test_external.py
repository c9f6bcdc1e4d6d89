"""`external_agent` on a real tiny vLLM CPU engine: the shipped openai-client agent (examples/agent_server/agent.py)
runs per row and its calls become a masked trajectory with its own reward; a program that crashes, hangs or never
calls the model ends with its own outcome and counter within the time-out; a plain Python callable works the same;
bad options are refused when the YAML loads."""

import asyncio
import sys
import time
from pathlib import Path

import pytest

from rlpost.agent import AgentLoopConfig, run_agent_loops
from rlpost.agent.metrics import aggregate_metrics
from rlpost.agent.registry import load_agent_loops
from rlpost.agent.trajectory import decode, encode
from rlpost.rollout.async_engine import sampling_kwargs
from rlpost.rollout.base import SamplingSpec
from rlpost.tools.utils.yaml_entries import ConfigEntryError

pytestmark = pytest.mark.timeout(300)

REPO = Path(__file__).resolve().parents[2]
AGENT = REPO / "examples" / "agent_server" / "agent.py"
SAMPLE = SamplingSpec(greedy=False, temperature=1.0, top_k=-1, top_p=1.0, max_tokens=80, ignore_eos=False,
                      logprobs=True)
FOLLOW_UP = "<|im_start|>user\nCheck it. Answer with #### followed by the number.<|im_end|>\n<|im_start|>assistant\n"


def solve(row, base_url, api_key):
    """A plain-function agent (runs in a thread): one call with the sync openai client."""
    from openai import OpenAI

    client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    client.chat.completions.create(model="any", messages=row["messages"], max_tokens=3)
    return {"reward": 0.5}


def _yaml(tmp_path, entries: str) -> str:
    path = tmp_path / "agents.yaml"
    path.write_text(entries)
    return str(path)


def test_programs_per_row_give_trajectories_outcomes_and_counters(vllm_engine, tmp_path):
    engine, tok = vllm_engine
    py = sys.executable
    load_agent_loops(_yaml(tmp_path, f"""
- {{name: ext_ok, _target_: rlpost.agent.external.ExternalAgentLoop, command: [{py}, {AGENT}], reward: program}}
- {{name: ext_crash, _target_: rlpost.agent.external.ExternalAgentLoop, command: [{py}, -c, "raise SystemExit(3)"],
   reward: program, failure_reward: -1.0}}
- {{name: ext_hang, _target_: rlpost.agent.external.ExternalAgentLoop, command: [{py}, -c, "import time; time.sleep(600)"],
   timeout_s: 4, reward: program}}
- {{name: ext_silent, _target_: rlpost.agent.external.ExternalAgentLoop, command: [{py}, -c, "print('hello')"],
   reward: program}}
- {{name: ext_fn, _target_: rlpost.agent.external.ExternalAgentLoop, callable: "test_external:solve", reward: program}}
- {{name: ext_rf, _target_: rlpost.agent.external.ExternalAgentLoop, command: [{py}, {AGENT}]}}
"""))
    names = ["ext_ok", "ext_crash", "ext_hang", "ext_silent", "ext_fn", "ext_rf"]
    rows = [{"raw_prompt": [{"role": "user", "content": "What is 2 + 3?"}], "agent_name": name,
             "reward_model": {"ground_truth": "5"}} for name in names]
    config = AgentLoopConfig(response_length=80)
    start = time.monotonic()
    outputs = asyncio.run(run_agent_loops(rows, engine.generate, config, tok, sampling_kwargs(SAMPLE)))
    elapsed = time.monotonic() - start
    by_name = dict(zip(names, outputs))
    outcome = {n: o.extra_fields["program_outcome"] for n, o in by_name.items()}
    assert outcome == {"ext_ok": "ok", "ext_crash": "crashed", "ext_hang": "timeout", "ext_silent": "no_model_call",
                       "ext_fn": "ok", "ext_rf": "ok"}
    assert elapsed < 60  # the hanging program was killed at 4 s; nothing waited for it
    ok = by_name["ext_ok"]
    assert ok.reward_score in (0.0, 1.0) and ok.metrics["assistant_turns"] == 2.0
    mask = ok.response_mask
    first_zero, last_zero = mask.index(0), len(mask) - 1 - mask[::-1].index(0)
    assert mask == [1] * first_zero + [0] * (last_zero - first_zero + 1) + [1] * (len(mask) - last_zero - 1)
    assert decode(tok, ok.response_ids[first_zero:last_zero + 1], False).endswith(FOLLOW_UP)
    assert ok.prompt_ids == encode(tok, tok.apply_chat_template(rows[0]["raw_prompt"], add_generation_prompt=True,
                                                                 tokenize=False))
    assert all(lp == 0.0 for lp, m in zip(ok.response_logprobs, mask) if m == 0)
    assert by_name["ext_crash"].reward_score == -1.0 and by_name["ext_hang"].reward_score == 0.0
    silent = by_name["ext_silent"]
    assert silent.response_ids == [tok.eos_token_id] and silent.response_mask == [0]
    assert by_name["ext_fn"].reward_score == 0.5 and len(by_name["ext_fn"].response_ids) <= 3
    assert by_name["ext_rf"].reward_score is None  # reward: reward_fn leaves the score to the trainer's function
    metrics = aggregate_metrics(outputs)
    assert {k: metrics[f"multi_turn/program/{k}"] for k in ("ok", "crashed", "timeout", "no_model_call", "no_reward")
            } == {"ok": 3.0, "crashed": 1.0, "timeout": 1.0, "no_model_call": 1.0, "no_reward": 0.0}
    assert metrics["multi_turn/program/history_resets"] == 0.0 and metrics["multi_turn/program/request_errors"] == 0.0


@pytest.mark.parametrize("entry, message", [
    ("{name: bad1, _target_: rlpost.agent.external.ExternalAgentLoop}", "set exactly one of 'command'"),
    ("{name: bad2, _target_: rlpost.agent.external.ExternalAgentLoop, command: x, timeout_s: 0}", "timeout_s=0"),
    ("{name: bad3, _target_: rlpost.agent.external.ExternalAgentLoop, command: x, reward: rm}", "reward='rm'"),
    ("{name: bad4, _target_: rlpost.agent.external.ExternalAgentLoop, callable: 'no_such_mod:f'}", "no_such_mod"),
    ("{name: bad5, _target_: rlpost.agent.external.ExternalAgentLoop, command: x, timeout: 3}", "timeout"),
])
def test_bad_options_are_refused_when_the_yaml_loads(tmp_path, entry, message):
    with pytest.raises(ConfigEntryError, match="bad[1-5]") as err:
        load_agent_loops(_yaml(tmp_path, f"- {entry}\n"))
    assert message in str(err.value)
