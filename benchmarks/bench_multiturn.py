"""Multi-turn rollout throughput against single-turn generation of the same number of model tokens.

    python benchmarks/bench_multiturn.py --prompts 64 256 --turns 4 --turn-tokens 256 --reps 5   # one GPU
    python benchmarks/bench_multiturn.py --device cpu --tiny --json-out /tmp/mt.json               # smoke test

A random-weight model (Qwen2.5-0.5B architecture, or `--tiny` on CPU) never calls a tool, so the multi-turn
workload comes from a benchmark-only agent loop, `bench_fixed_turns`: every trajectory runs `--turns` model
turns of exactly `--turn-tokens` tokens (ignore_eos), and between two turns awaits `--tool-latency-s` (a
simulated tool) and appends a fixed tool message as the chat template's delta (`TrajectoryBuilder`, as
`tool_agent` does). It goes through the real path: `AgentRollout.generate_sequences` on a `VLLMRollout`
(continuous batching by `VLLMStepEngine`). The baseline is the same rollout's single-turn
`generate_sequences` on the same prompts with a response of turns x turn_tokens tokens, so both generate
the same number of model tokens. Repetitions alternate which of the two runs first; the prefix cache is
reset before each timed call (the multi-turn call still reuses its own earlier turns within the call).
Writes one `benchmarks.harness` result, `benchmarks/results/<date>_<gpu|cpu>/multiturn.json` (or `--json-out`):
`B<prompts>_<multi_turn|single_turn>_s` timing metrics (median, spread, every repetition) and `B<prompts>_ratio`
(multi-turn over single-turn model tokens/s, with its target), the per-batch rows under `results`; prints a table.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.append(str(REPO))  # after PYTHONPATH: a snapshot of rlpost put there wins
sys.path.append(str(REPO / "benchmarks"))

import bench_limits  # noqa: E402

from benchmarks import harness  # noqa: E402
from rlpost import keys  # noqa: E402
from rlpost.agent.base import AgentLoopBase, AgentLoopOutput, register  # noqa: E402
from rlpost.agent.metrics import TrajectoryStats  # noqa: E402
from rlpost.agent.samples import prompt_messages  # noqa: E402
from rlpost.agent.trajectory import TrajectoryBuilder, encode, render  # noqa: E402
from rlpost.protocol import DataProto  # noqa: E402

LOOP_NAME = "bench_fixed_turns"
TOOL_TEXT = "result: 42 (cached; 3 rows matched)"
TARGET_RATIO = 0.7  # multi-turn model tokens/s over single-turn model tokens/s


@register(LOOP_NAME)
class FixedTurnsLoop(AgentLoopBase):
    """`turns` model turns of exactly `turn_tokens` tokens (ignore_eos), separated by a fixed tool message
    after an awaited `tool_latency_s`; settings come from the row's `extra_info`. The tokenization check is
    off: a random model's tokens do not survive decode and re-encode."""

    async def run(self, sampling_params: dict[str, Any], **sample: Any) -> AgentLoopOutput:
        spec = sample["extra_info"]
        turns, turn_tokens, latency = int(spec["turns"]), int(spec["turn_tokens"]), float(spec["tool_latency_s"])
        builder = TrajectoryBuilder(self.tokenizer, prompt_messages(sample, LOOP_NAME), self.config.response_length,
                                    None, self.config.template_kwargs)
        stats = TrajectoryStats()
        for turn in range(turns):
            ids, log_probs = await self.generate(builder.prompt_ids + builder.response_ids, sampling_params,
                                                 min(turn_tokens, builder.remaining))
            builder.add_model_turn(ids, log_probs)
            stats.assistant_turns += 1
            if turn == turns - 1 or builder.truncated:
                break
            await asyncio.sleep(latency)  # the simulated tool call: other trajectories keep the engine busy
            if not builder.add_messages([{"role": "tool", "content": TOOL_TEXT}]):
                break
            stats.user_turns += 1
            stats.tool_calls += 1
        traj = builder.result("disable")
        stats.truncated = traj.truncated
        return AgentLoopOutput(prompt_ids=traj.prompt_ids, response_ids=traj.response_ids,
                               response_mask=traj.response_mask, response_logprobs=traj.response_logprobs,
                               num_turns=stats.num_turns, metrics=stats.as_metrics())


def tool_budget(tokenizer: Any, turns: int, turn_tokens: int, slack: int = 8) -> int:
    """Response tokens to reserve for the `turns - 1` tool deltas: one delta measured after a model turn
    that did not end on EOS (the longest case: the template's closing text is part of the delta), plus
    `slack` per delta."""
    if turns <= 1:
        return 0
    builder = TrajectoryBuilder(tokenizer, [{"role": "user", "content": "hi"}], 10 * (turn_tokens + 1024))
    filler = encode(tokenizer, "word")[:1] * turn_tokens
    builder.add_model_turn(filler)
    before = len(builder.response_ids)
    assert builder.add_messages([{"role": "tool", "content": TOOL_TEXT}])
    return (turns - 1) * (len(builder.response_ids) - before + slack)


def make_prompts(tokenizer: Any, n: int, prompt_tokens: int, seed: int = 0) -> tuple[list[list[dict]], list[list[int]]]:
    """`n` one-message chats of random corpus lines, each rendered to at least `prompt_tokens` tokens;
    returns (messages, rendered prompt ids) per row."""
    from rlpost.utils.tiny_model import default_corpus

    lines = default_corpus(num_lines=400, seed=seed)
    rng = np.random.default_rng(seed)
    chats, ids = [], []
    for _ in range(n):
        words: list[str] = []
        row: list[int] = []
        while len(row) < prompt_tokens:
            words.extend(lines[int(rng.integers(len(lines)))] for _ in range(8))
            chat = [{"role": "user", "content": " ".join(words)}]
            row = encode(tokenizer, render(tokenizer, chat, None, True, {}))
        chats.append(chat)
        ids.append(row)
    return chats, ids


def _objects(values: list[Any]) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


def prompt_batch(tokenizer: Any, chats: list[list[dict]], ids: list[list[int]], prompt_length: int,
                 loop_settings: dict[str, Any]) -> DataProto:
    """The rows both paths read: left-padded `input_ids` (B, P) and `raw_prompt_ids` for the single-turn
    rollout, `raw_prompt` / `agent_name` / `extra_info` for the agent loops."""
    b, pad = len(ids), tokenizer.pad_token_id
    input_ids = torch.full((b, prompt_length), pad, dtype=torch.long)
    attention = torch.zeros((b, prompt_length), dtype=torch.long)
    for i, row in enumerate(ids):
        input_ids[i, prompt_length - len(row):] = torch.tensor(row)
        attention[i, prompt_length - len(row):] = 1
    return DataProto.from_dict(
        tensors={keys.INPUT_IDS: input_ids, keys.ATTENTION_MASK: attention,
                 keys.POSITION_IDS: (attention.cumsum(-1) - 1).clamp(min=0)},
        non_tensors={keys.RAW_PROMPT: _objects(chats), keys.RAW_PROMPT_IDS: _objects(ids),
                     keys.AGENT_NAME: _objects([LOOP_NAME] * b), keys.UID: _objects([str(uuid.uuid4()) for _ in ids]),
                     "extra_info": _objects([dict(loop_settings) for _ in ids])},
        meta_info={keys.META_EOS_TOKEN_ID: tokenizer.eos_token_id, keys.META_PAD_TOKEN_ID: pad,
                   keys.META_CHAT_TEMPLATE_KWARGS: {}, keys.META_DO_SAMPLE: True, keys.META_VALIDATE: False})


def rollout_config(args: argparse.Namespace, model_dir: Path, prompt_length: int, response_length: int):
    """`actor_rollout_ref.rollout` of the packaged `ppo_trainer` config, composed and validated."""
    from hydra import compose, initialize_config_dir

    from rlpost.trainer.config import CONFIG_DIR, validate_config

    rollout = "actor_rollout_ref.rollout"
    over = [
        f"trainer.device={args.device}", "trainer.n_gpus_per_node=1", "data.train_batch_size=8",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "critic.ppo_micro_batch_size_per_gpu=2", f"actor_rollout_ref.model.path={model_dir}",
        f"data.max_prompt_length={prompt_length}", f"data.max_response_length={response_length}",
        "data.return_raw_chat=true", f"{rollout}.name=vllm", f"{rollout}.multi_turn.enable=true",
        f"{rollout}.agent.default_agent_loop={LOOP_NAME}", f"{rollout}.ignore_eos=true",
        f"{rollout}.load_format=auto", f"{rollout}.tensor_model_parallel_size=1",
        f"{rollout}.gpu_memory_utilization={args.gpu_memory_utilization}",
        f"{rollout}.enforce_eager={args.device != 'cuda'}",
        f"{rollout}.max_num_batched_tokens={args.max_num_batched_tokens}",
        f"{rollout}.dtype={'float32' if args.tiny else 'bfloat16'}", *args.override,
    ]
    with initialize_config_dir(str(CONFIG_DIR), version_base=None):
        cfg = compose("ppo_trainer", overrides=over)
    return validate_config(cfg).actor_rollout_ref.rollout


def summary(seconds: list[float], tokens: int) -> dict[str, Any]:
    """Median, quartiles and range (harness.spread) of one path's repetitions, and the model tokens/s."""
    sp = harness.spread(seconds)
    med = sp["median"]
    return {"median_s": med, "q1_s": sp["q1"], "q3_s": sp["q3"], "min_s": sp["min"], "max_s": sp["max"],
            "all_s": seconds,
            "model_tokens": tokens, "tokens_per_s": tokens / med, "tokens_per_s_min": tokens / max(seconds),
            "tokens_per_s_max": tokens / min(seconds)}


def measure(args: argparse.Namespace, model_dir: Path) -> list[dict[str, Any]]:
    """Both paths for every batch size in `args.prompts`, on one engine."""
    from transformers import AutoTokenizer

    from rlpost.rollout import build_rollout
    from rlpost.workers.agent_rollout import AgentRollout

    tok = AutoTokenizer.from_pretrained(str(model_dir), padding_side="left")
    k, t = args.turns, args.turn_tokens
    settings = {"turns": k, "turn_tokens": t, "tool_latency_s": args.tool_latency_s}
    prompts = {b: make_prompts(tok, b, args.prompt_tokens, seed=b) for b in args.prompts}
    p = max(len(row) for _, ids in prompts.values() for row in ids)
    mt_cfg = rollout_config(args, model_dir, p, k * t + tool_budget(tok, k, t))
    st_cfg = rollout_config(args, model_dir, p, k * t)
    rollout = build_rollout(mt_cfg, str(model_dir), tok, args.device)
    rollout.config = st_cfg  # single-turn rows get k*t tokens; the engine was sized for the multi-turn budget
    agents = AgentRollout(mt_cfg, tok)
    engines: list[Any] = []
    make_engine = rollout.agent_engine

    def tracked_engine(stop_ids: set[int]) -> Any:  # keeps each call's engine front for its max_in_flight
        engines.append(make_engine(stop_ids))
        return engines[-1]

    rollout.agent_engine = tracked_engine
    results = []
    for b in args.prompts:
        batch = prompt_batch(tok, *prompts[b], p, settings)
        res = run_batch(args, rollout, agents, batch, engines)
        # the engine's lengths: P (longest rendered prompt), the multi-turn budget (turns + tool deltas)
        res.update(prompt_length=p, multi_turn_response_length=int(mt_cfg.response_length),
                   single_turn_response_length=int(st_cfg.response_length),
                   enable_prefix_caching=bool(mt_cfg.enable_prefix_caching))
        results.append(res)
    return results


def run_batch(args: argparse.Namespace, rollout: Any, agents: Any, batch: DataProto, engines: list[Any]
              ) -> dict[str, Any]:
    """`args.reps` timed calls of each path on `batch` (alternating which runs first), after one untimed
    call of each on a few rows."""
    b, k, t = len(batch), args.turns, args.turn_tokens
    agents.generate_sequences(rollout, batch[: min(b, 8)])  # warm-up of both paths
    rollout.generate_sequences(batch[: min(b, 8)])
    times: dict[str, list[float]] = {"multi_turn": [], "single_turn": []}
    in_flight = []
    sync = torch.cuda.synchronize if torch.cuda.is_available() else None
    for rep in range(args.reps):
        for path in harness.order(rep, list(times)):
            rollout.llm.reset_prefix_cache()
            if path == "multi_turn":
                s, out = harness.timed(lambda: agents.generate_sequences(rollout, batch), sync)
                check_multi_turn(out, b, k, t)
                in_flight.append(engines[-1].max_in_flight)
            else:
                s, out = harness.timed(lambda: rollout.generate_sequences(batch), sync)
                assert out.batch[keys.RESPONSES].shape == (b, k * t), out.batch[keys.RESPONSES].shape
            times[path].append(s)
        print(f"[multiturn] B={b} rep {rep}: multi-turn {times['multi_turn'][-1]:.2f} s, "
              f"single-turn {times['single_turn'][-1]:.2f} s", flush=True)
    res = {"prompts": b, **{path: summary(s, b * k * t) for path, s in times.items()}, "max_in_flight": in_flight,
           "ratio_per_rep": [st / mt for mt, st in zip(times["multi_turn"], times["single_turn"])]}
    res["ratio"] = res["multi_turn"]["tokens_per_s"] / res["single_turn"]["tokens_per_s"]
    res["meets_target"] = res["ratio"] >= TARGET_RATIO
    return res


def check_multi_turn(out: DataProto, b: int, turns: int, turn_tokens: int) -> None:
    """Every trajectory ran all its turns in full: turns x turn_tokens model tokens, none truncated."""
    model_tokens = int(out.batch[keys.RESPONSE_MASK].sum())
    assert model_tokens == b * turns * turn_tokens, (model_tokens, b * turns * turn_tokens)
    assert out.non_tensor_batch[keys.NUM_TURNS].tolist() == [2 * turns] * b, out.non_tensor_batch[keys.NUM_TURNS]
    assert not any(m["truncated"] for m in out.non_tensor_batch[keys.AGENT_METRICS])


def print_table(results: list[dict[str, Any]]) -> None:
    print(f"{'B':>5} {'multi-turn tok/s':>17} {'single-turn tok/s':>18} {'ratio':>6} {'rep ratios min-max':>19}"
          f" {'in flight':>9}")
    for r in results:
        mt, st, reps = r["multi_turn"], r["single_turn"], r["ratio_per_rep"]
        print(f"{r['prompts']:>5} {mt['tokens_per_s']:>17.0f} {st['tokens_per_s']:>18.0f} {r['ratio']:>6.2f} "
              f"{min(reps):>9.2f}-{max(reps):<9.2f} {max(r['max_in_flight']):>9}")
    print(f"target: ratio >= {TARGET_RATIO}")


def build_result(args: argparse.Namespace, results: list[dict[str, Any]], env: dict[str, Any] | None = None
                 ) -> harness.Result:
    """The harness result of `measure`'s rows: each path's times and the tokens/s ratio per batch size."""
    res = harness.Result("multiturn", harness.command_line(), args.reps, env=env or harness.environment())
    for r in results:
        for path in ("multi_turn", "single_turn"):
            res.timing(f"B{r['prompts']}_{path}_s", r[path]["all_s"], tokens_per_s=r[path]["tokens_per_s"])
        res.metric(f"B{r['prompts']}_ratio", r["ratio"], unit="multi-turn/single-turn tokens/s",
                   values=r["ratio_per_rep"], target=f">= {TARGET_RATIO}", met=r["meets_target"])
    res.extra.update(settings=harness.params(args), target_ratio=TARGET_RATIO, results=results)
    return res


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--tiny", action="store_true", help="tiny random model and sizes (CPU smoke test)")
    ap.add_argument("--model-dir", type=Path, default=None, help="an HF model folder instead of a random one")
    ap.add_argument("--prompts", type=int, nargs="+", default=None, help="batch sizes B (default 64 256)")
    ap.add_argument("--turns", type=int, default=None, help="model turns K per trajectory (default 4)")
    ap.add_argument("--turn-tokens", type=int, default=None, help="tokens T per model turn (default 256)")
    ap.add_argument("--prompt-tokens", type=int, default=None, help="rendered prompt tokens (default 256)")
    ap.add_argument("--tool-latency-s", type=float, default=0.05, help="simulated tool latency between turns")
    ap.add_argument("--reps", type=int, default=None, help="timed repetitions per path (default 5)")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    ap.add_argument("--max-num-batched-tokens", type=int, default=16384)
    ap.add_argument("--json-out", type=Path, default=None)
    ap.add_argument("--override", nargs="*", default=[], help="extra Hydra overrides of ppo_trainer")
    args = ap.parse_args(argv)
    small = {"prompts": [4], "turns": 2, "turn_tokens": 8, "prompt_tokens": 32, "reps": 2}
    full = {"prompts": [64, 256], "turns": 4, "turn_tokens": 256, "prompt_tokens": 256, "reps": 5}
    for key, val in (small if args.tiny else full).items():
        if getattr(args, key) is None:
            setattr(args, key, val)
    if args.device == "cpu":
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        if args.model_dir is not None:
            model_dir = args.model_dir
        elif args.tiny:
            from rlpost.utils.tiny_model import build_tiny_model

            model_dir = build_tiny_model(Path(tmp) / "tiny")
        else:
            model_dir = bench_limits.build_model(Path(tmp) / "qwen05_random")
        results = measure(args, model_dir)
    out = build_result(args, results).write(path=args.json_out)
    print_table(results)
    print(f"[multiturn] wrote {out}")


if __name__ == "__main__":
    main()
