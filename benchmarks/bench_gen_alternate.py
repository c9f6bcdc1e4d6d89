"""Generation in the GRPO loop against a bare vLLM engine on the same GPU, alternated round by round.

    python3 benchmarks/bench_gen_alternate.py --model-dir /tmp/m_0.5b --prompt-len 28 --reps 8 \\
        --limits-json /tmp/limits.json      # on a GPU host (docs/benchmarks/generation.md)

Issue 18 §5 asks for generation in the loop at >= 0.90 of a bare engine, measured alternately. Two vLLM engines
cannot share one process, so the bare engine lives in a subprocess started first (`--serve-bare`:
`bench_limits.bare_engine`, vLLM's defaults, the same length, model and memory share) and generates when told to.
This process runs full GRPO steps through rlpost's own worker (`bench_grpo_step.grpo_step`: level-2 sleep, weight
sync, wake, generate, sleep, log-probs, update), so each rlpost generation follows the training phases, as in
`main_ppo`. Both engines stay resident (the bare one idle while the loop runs), so the default memory share
is 0.35 each.

Each round runs one bare generation and one GRPO step, the order swapping every round (a drift of the host lands
on both). Both sides time a fixed pure-Python loop on the generating thread just before the call
(`benchmarks.harness.cpu_probe_ms`): the host core's speed, which earlier runs found to set a generation's time.
Per round: bare / rlpost of the whole `gen` and of its engine part; medians and ranges over the rounds.
With `--limits-json` (a `bench_limits.py` run of the same batch just before), the step is also set against the
sum of limits with the alternated bare generation in place of the limits' own.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

REPO = Path(__file__).resolve().parents[1]
sys.path.append(str(REPO))
sys.path.append(str(REPO / "benchmarks"))

TAG = "@@bench "  # prefix of the bare server's protocol lines (vLLM logs to the same stdout)


def order(round_index: int) -> tuple[str, str]:
    """Bare first on even rounds, rlpost first on odd ones."""
    return ("bare", "rlpost") if round_index % 2 == 0 else ("rlpost", "bare")


def spread(values: list[float]) -> dict[str, Any]:
    """Median, lowest and highest of `values` (empty: Nones)."""
    if not values:
        return {"median": None, "min": None, "max": None, "n": 0}
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def summarize(rounds: list[dict[str, Any]], limits: dict[str, Any] | None = None) -> dict[str, Any]:
    """Per-round paired ratios (bare / rlpost: >= 0.90 is the target) and each side's spread. `limits`: one
    batch's entry of bench_limits' `per_batch` plus its `reload`; the step is then set against
    bare gen (alternated median) + 2 x fwd + train + reload."""
    bare = [r["bare"]["s"] for r in rounds]
    gen = [r["rlpost"]["gen"] for r in rounds]
    out: dict[str, Any] = {
        "bare_gen_s": spread(bare), "rlpost_gen_s": spread(gen),
        "paired_gen_ratio": spread([b / g for b, g in zip(bare, gen)]),
        "step_s": spread([r["rlpost"]["step"] for r in rounds]),
        "bare_probe_ms": spread([r["bare"]["probe_ms"] for r in rounds]),
        "rlpost_probe_ms": spread([r["rlpost_probe_ms"] for r in rounds])}
    engine = [r["rlpost"].get("gen_engine") for r in rounds]
    if all(e is not None for e in engine):
        out["rlpost_gen_engine_s"] = spread(engine)
        out["paired_engine_ratio"] = spread([b / e for b, e in zip(bare, engine)])
        out["rlpost_wake_plus_sleep_s"] = spread([r["rlpost"].get("gen_wake", 0.0) + r["rlpost"].get("gen_sleep", 0.0)
                                                  for r in rounds])
    if limits is not None:
        rest = 2 * limits["fwd"]["s"] + limits["train"]["s"] + limits["reload_s"]
        sum_limits = out["bare_gen_s"]["median"] + rest
        out["sum_limits_s"] = sum_limits
        out["step_over_sum_limits"] = out["step_s"]["median"] / sum_limits
        out["paired_step_over_sum_limits"] = spread([r["rlpost"]["step"] / (r["bare"]["s"] + rest) for r in rounds])
    return out


def read_reply(stream: IO[str], echo: IO[str]) -> dict[str, Any]:
    """The next protocol line of the bare server, echoing its other output; EOF means it died."""
    for line in stream:
        if line.startswith(TAG):
            return json.loads(line[len(TAG):])
        echo.write(line)
    raise RuntimeError("bench_gen_alternate: the bare engine's process ended (its output is above)")


def serve_bare(args: argparse.Namespace) -> None:
    """The bare engine: build, warm up, then one timed generation per `gen` line on stdin."""
    import bench_limits
    from benchmarks.harness import cpu_probe_ms
    from vllm import SamplingParams

    llm, start_s = bench_limits.bare_engine(args.model_dir, args.prompt_len + args.response_len,
                                            args.gpu_memory_utilization, False)
    prompts = bench_limits.random_prompts(args.prompts, args.prompt_len, seed=args.prompts, high=args.vocab)
    requests = [{"prompt_token_ids": row.tolist()} for row in prompts]
    params = SamplingParams(n=args.n, temperature=1.0, max_tokens=args.response_len, ignore_eos=True,
                            detokenize=False)
    llm.generate(requests[:4], SamplingParams(n=args.n, max_tokens=16, ignore_eos=True, detokenize=False),
                 use_tqdm=False)
    print(TAG + json.dumps({"ready": True, "engine_start_s": start_s}), flush=True)
    for line in sys.stdin:
        if line.strip() != "gen":
            break
        probe = cpu_probe_ms()
        bench_limits.sync()
        start = time.perf_counter()
        outs = llm.generate(requests, params, use_tqdm=False)
        bench_limits.sync()
        seconds = time.perf_counter() - start
        tokens = sum(len(c.token_ids) for o in outs for c in o.outputs)
        assert tokens == args.prompts * args.n * args.response_len, tokens
        print(TAG + json.dumps({"s": seconds, "probe_ms": probe, "tokens": tokens}), flush=True)


def start_bare(args: argparse.Namespace) -> subprocess.Popen:
    cmd = [sys.executable, __file__, "--serve-bare", "--model-dir", str(args.model_dir), "--vocab", str(args.vocab),
           "--prompts", str(args.prompts), "--n", str(args.n), "--prompt-len", str(args.prompt_len),
           "--response-len", str(args.response_len), "--gpu-memory-utilization", str(args.gpu_memory_utilization)]
    return subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)


def step_args(args: argparse.Namespace) -> argparse.Namespace:
    """bench_grpo_step's arguments for `grpo_config` (its defaults, this script's batch and memory share)."""
    return argparse.Namespace(grad_ckpt=1, prompt_len=args.prompt_len, response_len=args.response_len, n=args.n,
                              enforce_eager=False, gpu_memory_utilization=args.gpu_memory_utilization,
                              max_num_batched_tokens=16384, fwd_micro=args.fwd_micro, train_micro=args.train_micro,
                              mini_prompts=args.prompts, override=args.override)


def run(args: argparse.Namespace) -> dict[str, Any]:
    import bench_grpo_step
    import bench_limits
    import torch
    from benchmarks.harness import cpu_probe_ms

    limits = None
    if args.limits_json is not None:
        lim = json.loads(args.limits_json.read_text())
        limits = {**lim["per_batch"][str(args.prompts)], "reload_s": lim["reload"]["s"]}
    bare = start_bare(args)
    res: dict[str, Any] = {"env": bench_limits.env_info(), "args": {k: str(v) for k, v in vars(args).items()},
                           "bare_start": read_reply(bare.stdout, sys.stdout), "rounds": []}
    device = "cuda" if torch.cuda.is_available() else "cpu"
    worker = bench_grpo_step.start_worker(bench_grpo_step.grpo_config(args.model_dir, step_args(args)), device)
    prompts = bench_limits.random_prompts(args.prompts, args.prompt_len, seed=args.prompts, high=args.vocab)
    bench_grpo_step.grpo_step(worker, prompts, args.n)  # untimed: the optimizer state, the first sync
    try:
        for r in range(args.reps):
            row: dict[str, Any] = {"round": r, "order": list(order(r))}
            for side in order(r):
                if side == "bare":
                    bare.stdin.write("gen\n")
                    row["bare"] = read_reply(bare.stdout, sys.stdout)
                else:
                    row["rlpost_probe_ms"] = cpu_probe_ms()
                    row["rlpost"] = bench_grpo_step.grpo_step(worker, prompts, args.n)
            row["gen_ratio"] = row["bare"]["s"] / row["rlpost"]["gen"]
            res["rounds"].append(row)
            print(f"[alternate] round {r} ({'/'.join(row['order'])}): bare {row['bare']['s']:.2f}s "
                  f"rlpost gen {row['rlpost']['gen']:.2f}s step {row['rlpost']['step']:.2f}s "
                  f"ratio {row['gen_ratio']:.3f}", flush=True)
            res["summary"] = summarize(res["rounds"], limits)
            build_result(args, res).write(path=args.json_out)  # a run cut short keeps its rounds
    finally:
        bare.stdin.close()
        try:
            bare.wait(timeout=120)
        except subprocess.TimeoutExpired:  # keep the original error, if any, in front
            bare.kill()
    return res


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-dir", type=Path, required=True, help="built here when missing (bench_limits)")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=28)
    ap.add_argument("--response-len", type=int, default=512)
    ap.add_argument("--fwd-micro", type=int, default=32)
    ap.add_argument("--train-micro", type=int, default=32)
    ap.add_argument("--reps", type=int, default=8, help="rounds, each one bare generation and one GRPO step")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.35, help="each engine's share")
    ap.add_argument("--limits-json", type=Path, default=None, help="bench_limits.py's JSON of the same batch")
    ap.add_argument("--override", nargs="*", default=[], help="extra Hydra overrides of the rlpost worker")
    ap.add_argument("--json-out", type=Path, default=REPO / "benchmarks" / "results" / "gen_alternate.json")
    ap.add_argument("--vocab", type=int, default=150000, help=argparse.SUPPRESS)  # set by main
    ap.add_argument("--serve-bare", action="store_true", help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def main() -> None:
    args = parse_args()
    if args.serve_bare:
        return serve_bare(args)
    import bench_limits

    args.vocab = bench_limits.model_vocab(args.model_dir)  # as bench_grpo_step
    args.json_out.parent.mkdir(parents=True, exist_ok=True)
    res = run(args)
    print("[alternate] " + json.dumps(res["summary"]), flush=True)
    print(f"[alternate] wrote {args.json_out}", flush=True)


def build_result(args: argparse.Namespace, res: dict[str, Any]) -> Any:
    """The harness result of the rounds so far: bare over in-loop generation time as the paired ratio of the
    rounds (geometric mean, 95 % interval once there are two); the rounds and summary kept as they were."""
    from benchmarks import harness

    res = dict(res)
    rounds = res["rounds"]
    result = harness.Result("gen_alternate", harness.command_line(), len(rounds), env=res.pop("env"))
    if rounds:
        ratio = harness.paired_ratio([r["bare"]["s"] for r in rounds], [r["rlpost"]["gen"] for r in rounds])
        result.metric("gen_bare_over_rlpost", ratio["value"], ratio.get("ci_low"), ratio.get("ci_high"),
                      unit="bare/rlpost", values=[r["gen_ratio"] for r in rounds])
    result.extra.update({**res, "args": harness.params(args)})
    return result


if __name__ == "__main__":
    main()
