"""Multi-turn rollouts with rollout tensor parallelism 2, on 2 gloo ranks: the block's first rank runs every agent
loop of the block (real `tool_agent` loops, real tools that return after different delays) and drives its
engine through the lock-step driver; the peer replays each engine call. The peer's engine sees exactly the
driver's calls, in the same order, and every step checks over the TP group that both engines hold the same
requests (as the shards of one SPMD engine must); each rank gets its own rows of a batch equal to a TP-1
run of the same rows. A failure on the first rank reaches the peer as an error, not a hang; a peer whose
engine finishes other requests is stopped with `LockstepError`.

The engine is a scripted stepped engine (a random tiny model never calls tools): its reply depends only on
the row's marker and the turn, and takes one step per 4 reply tokens, so requests finish at different steps.
"""

from __future__ import annotations

import os
import sys
import zlib

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "agent"))
from _agent_doubles import call, schema  # noqa: E402
from _fsdp_helpers import spawn  # noqa: E402

from rlpost.agent.trajectory import encode  # noqa: E402
from rlpost.protocol import DataProto  # noqa: E402
from rlpost.rollout.async_engine import SteppedEngine  # noqa: E402
from rlpost.rollout.base import BaseRollout  # noqa: E402
from rlpost.rollout.lockstep import LockstepError, StepChannel, finished_digest, follow  # noqa: E402

pytestmark = pytest.mark.timeout(180)

# marker -> replies per turn; "slow" answers after 0.2 s, "fast" after 0.01 s
SCRIPTS = {
    "A": [call("slow", tag="A"), call("fast", tag="A2"), "A is done"],
    "B": [call("fast", tag="B"), call("fast", tag="B2"), call("fast", tag="B3"), "B done"],
    "C": ["C answers at once, a longer reply than the others"],
    "D": [call("calculator", expression="12 * 34"), "D done: 408"],
}
FAILING = {"E": [RuntimeError("the engine rejected E")]}
ROWS = [["A", "B"], ["C", "D"]]  # the trainer's shard of each rank


class SpmdScriptedEngine(SteppedEngine):
    """Scripted replies (module docstring). With a `group`, every step compares a digest of the running
    requests across the group first, as the shards of one engine would pair up their collectives."""

    def __init__(self, tokenizer, scripts, group=None):
        super().__init__()
        self.tokenizer, self.scripts, self.group = tokenizer, scripts, group
        self.running: dict[str, list] = {}
        self.calls: list[tuple] = []

    def _add(self, request_id, prompt_ids, spec):
        text = self.tokenizer.decode(prompt_ids, skip_special_tokens=False)
        marker = next(m for m in self.scripts if f"{m}:" in text)
        reply = self.scripts[marker][text.count("<|im_start|>assistant") - 1]
        self.calls.append(("add", request_id, tuple(prompt_ids), spec.max_tokens))
        if isinstance(reply, Exception):
            raise reply
        ids = (encode(self.tokenizer, reply) + [self.tokenizer.eos_token_id])[: spec.max_tokens]
        self.running[request_id] = [1 + len(ids) // 4, ids]

    def _step(self):
        state = sorted((rid, left) for rid, (left, _) in self.running.items())
        self.calls.append(("step", tuple(state)))
        if self.group is not None:
            import torch.distributed as dist

            digest = torch.tensor([zlib.crc32(repr(state).encode())], dtype=torch.int64)
            both = [torch.zeros_like(digest) for _ in range(2)]
            dist.all_gather(both, digest, group=self.group)
            if both[0].item() != both[1].item():
                raise RuntimeError("the SPMD engines diverged")
        done = []
        for rid, entry in list(self.running.items()):
            entry[0] -= 1
            if entry[0] == 0:
                done.append((rid, entry[1], [-0.1] * len(entry[1])))
                del self.running[rid]
        return done

    def _abort(self, request_ids):
        self.calls.append(("abort", tuple(request_ids)))
        for rid in request_ids:
            self.running.pop(rid, None)


class ScriptedRollout(BaseRollout):
    """A rollout whose agent front is a fresh `SpmdScriptedEngine` per call, its calls kept in `engines`."""

    agent_tp_mode = "lockstep"

    def __init__(self, tokenizer, scripts, group=None):
        self.tokenizer, self.scripts, self.group, self.engines = tokenizer, scripts, group, []

    def agent_engine(self, stop_ids):
        self.engines.append(SpmdScriptedEngine(self.tokenizer, self.scripts, self.group))
        return self.engines[-1]

    def generate_sequences(self, prompts):
        raise NotImplementedError("single-turn generation is not part of these tests")

    def update_weights(self, named_tensors):
        raise NotImplementedError("no weights in a scripted engine")


def _tool_yaml(path: str) -> str:
    import yaml

    tools = [{"class_name": "_agent_doubles.SleepTool", "config": {"type": "native", "sleep_s": s},
              "tool_schema": schema(name)} for name, s in (("slow", 0.2), ("fast", 0.01))]
    tools.append({"class_name": "rlpost.tools.calculator_tool.CalculatorTool", "config": {"type": "native"},
                  "tool_schema": schema("calculator")})
    with open(path, "w") as f:
        yaml.safe_dump({"tools": tools}, f)
    return path


def _rollout_config(tool_yaml: str):
    from _compose import SMALL, compose_config

    cfg = compose_config(*SMALL, "data.max_prompt_length=800", "data.max_response_length=600",
                         "actor_rollout_ref.rollout.multi_turn.enable=true",
                         "actor_rollout_ref.rollout.calculate_log_probs=true",
                         f"actor_rollout_ref.rollout.multi_turn.tool_config_path={tool_yaml}")
    return cfg.actor_rollout_ref.rollout


def _setup(model_dir: str, rollout_config):
    from transformers import AutoTokenizer

    from rlpost.utils.tiny_model import CHAT_TEMPLATE
    from rlpost.workers.agent_rollout import AgentRollout

    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.chat_template = CHAT_TEMPLATE
    return tok, AgentRollout(rollout_config, tok)


def _prompts(tok, markers) -> DataProto:
    import numpy as np

    chats = np.empty(len(markers), dtype=object)
    chats[:] = [[{"role": "user", "content": f"{m}: use the tools, then answer."}] for m in markers]
    return DataProto.from_dict(non_tensors={"raw_prompt": chats, "agent_name": np.array(["tool_agent"] * len(markers),
                                                                                        dtype=object)},
                               meta_info={"eos_token_id": tok.eos_token_id, "pad_token_id": tok.pad_token_id,
                                          "do_sample": False})


def _rank(rank: int, model_dir: str, rollout_config, out_dir: str) -> None:
    from _agent_doubles import SleepTool

    from rlpost.utils.distributed import consecutive_groups, init_distributed

    init_distributed("cpu")
    group, tp_rank = consecutive_groups(2)
    tok, agent = _setup(model_dir, rollout_config)
    SleepTool.log = []
    rollout = ScriptedRollout(tok, {**SCRIPTS, **FAILING}, group)
    out = agent.generate_in_block(rollout, _prompts(tok, ROWS[rank]), group, tp_rank)
    tool_calls = len([e for e in SleepTool.log if e[0] == "start"])
    try:
        agent.generate_in_block(rollout, _prompts(tok, ["E"] if rank == 0 else ["C"]), group, tp_rank)
        failure = None
    except Exception as err:  # noqa: BLE001  (compared in the test)
        failure = f"{type(err).__name__}: {err}"
    torch.save({"out": out.batch.to_dict() if hasattr(out.batch, "to_dict") else dict(out.batch.items()),
                "turns": out.non_tensor_batch["__num_turns__"].tolist(),
                "calls": rollout.engines[0].calls, "tool_calls": tool_calls, "failure": failure},
               os.path.join(out_dir, f"rank{rank}.pt"))


def test_tp2_agent_loops_drive_one_engine_in_lock_step(tiny_model_dir, tmp_path):
    rollout_config = _rollout_config(_tool_yaml(str(tmp_path / "tools.yaml")))
    spawn(_rank, (tiny_model_dir, rollout_config, str(tmp_path)), str(tmp_path))
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in (0, 1))

    # the peer's engine received exactly the driver's calls, in order, and stepped as often
    assert r0["calls"] == r1["calls"]
    kinds = [c[0] for c in r0["calls"]]
    assert kinds.count("add") == 3 + 4 + 1 + 2  # one request per assistant turn of the four trajectories
    # turns joined the running batch after tools returned (not all adds before the first step)
    assert "add" in kinds[kinds.index("step"):]
    assert r0["tool_calls"] == 5 and r1["tool_calls"] == 0  # tools ran once, on the driver only

    # the same rows on one engine (TP 1) give the same batch; each rank holds its own rows of it
    tok, agent = _setup(tiny_model_dir, rollout_config)
    single = agent.generate_sequences(ScriptedRollout(tok, SCRIPTS), _prompts(tok, ROWS[0] + ROWS[1]))
    assert sorted(r0["out"]) == sorted(single.batch.keys())
    for key in r0["out"]:
        assert torch.equal(torch.cat([r0["out"][key], r1["out"][key]]), single.batch[key]), key
    assert r0["turns"] + r1["turns"] == single.non_tensor_batch["__num_turns__"].tolist() == [6, 8, 2, 4]

    # a failure on the first rank reaches the peer as an error (no hang), the driver keeps its own
    assert r0["failure"] == "RuntimeError: the engine rejected E"
    assert r1["failure"].startswith("RuntimeError: multi-turn rollout failed on the first rank of this "
                                    "tensor-parallel block (rank 0): RuntimeError: the engine rejected E")


class ListChannel(StepChannel):
    def __init__(self, messages):
        self.messages = list(messages)

    def send(self, message):
        self.messages.append(message)

    def recv(self):
        return self.messages.pop(0)


def test_a_peer_that_finishes_other_requests_is_stopped(tiny_model_dir):
    """`follow` on an engine whose steps finish other requests than the driver reports: LockstepError, raised
    only once the driver releases the peer (the driver is never left waiting in a broadcast)."""
    from transformers import AutoTokenizer

    from rlpost.rollout.base import SamplingSpec

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    spec = SamplingSpec(greedy=True, temperature=0.0, top_k=-1, top_p=1.0, max_tokens=4, ignore_eos=False,
                        logprobs=True)
    prompt = encode(tok, "C: hi<|im_start|>assistant\n")
    add = ("add", "agent-0", prompt, spec)
    # 4 reply tokens: the request needs 2 steps; the driver claims it finished after the first
    none, first = finished_digest([]), finished_digest(["agent-0"])
    channel = ListChannel([("step", [add], none), ("step", [], first), ("stop", [], none)])
    engine = SpmdScriptedEngine(tok, {"C": ["one two three four"]})
    with pytest.raises(LockstepError, match=r"out of step after 1 engine steps: this rank's engine finished \[\] in "
                                            "its last step, the driver's engine other requests"):
        follow(engine, channel)
    assert channel.messages == [] and [c[0] for c in engine.calls] == ["add", "step", "step"]

    in_step = ListChannel([("step", [add], none), ("step", [], none), ("stop", [], first)])
    stats = follow(SpmdScriptedEngine(tok, {"C": ["one two three four"]}), in_step)
    assert (stats.steps, stats.adds, stats.aborts, stats.errors) == (2, 1, 0, [])


def test_check_script_compares_row_by_row_and_wants_an_even_row_count():
    """scripts/check_multiturn_tp.py (the real-engine TP 2 / TP 1 check): its comparison counts the identical rows
    and the rows with a tool turn; an odd --rows is refused before anything starts."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "scripts"))
    import check_multiturn_tp as check

    tensors = {k: torch.arange(12).reshape(3, 4) for k in check.KEYS}
    other = {k: v.clone() for k, v in tensors.items()}
    other["responses"][1, 3] = -1
    tp1 = {"tensors": tensors, "turns": [4, 2, 6], "generate_s": 0.5}
    tp2 = {"tensors": other, "turns": [4, 2, 6], "generate_s": 1.5}
    summary = check.compare(tp1, tp2)
    assert (summary["rows"], summary["rows_identical"], summary["tool_turn_rows"]) == (3, 2, 2)
    assert summary["generate_s"] == {"tp1": 0.5, "tp2": 1.5}
    with pytest.raises(SystemExit):
        check.main(["--model", "m", "--data", "d", "--out", "o", "--rows", "3"])
