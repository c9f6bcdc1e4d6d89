"""SGLang generation inside rlpost's worker against bare SGLang offline generation, and both against vLLM.

    python benchmarks/bench_sglang.py --prompts 64 128 --n 8 --reps 5      # on a GPU host (docs/benchmarks/sglang.md)

Same model and batch as `benchmarks/bench_grpo_step.py` (random-weight Qwen2.5-0.5B architecture, 512-token
prompts, n samples of exactly 512 tokens, temperature 1, CUDA graphs). Four measurements, each in its own
process (fresh CUDA context, the GPU to itself):
- `sglang:bare`: `sglang.Engine` on the saved model with the arguments rlpost would pass, `engine.generate`;
- `sglang:loop`: `ActorRolloutRefWorker` with rollout.name=sglang, `generate_sequences` (wake, generate,
  batch assembly, sleep; the weights synced from the actor), as the trainer's `gen` phase;
- `vllm:bare`, `vllm:loop`: the same with vLLM (`bench_limits.bare_generate`, rollout.name=vllm).
vLLM's processes run without the SGLang bundle on PYTHONPATH. Each process measures every batch size `--reps`
times after a warm-up and reports medians; `--rounds` > 1 repeats the four processes in alternating order.
`--grpo-step` also times whole GRPO steps in the loop processes. Writes one `benchmarks.harness` result,
`benchmarks/results/<date>_<gpu>/sglang.json` (`--out-dir` for another folder), after every process: a
`<engine>_<bare|loop>_<prompts>_gen_s` timing metric per mode and batch size (every repetition of every round),
the loop / bare and SGLang / vLLM ratios as metrics, the summary and runs beside them.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.append(str(REPO))  # after PYTHONPATH: a snapshot of rlpost put there wins
sys.path.append(str(REPO / "benchmarks"))

import bench_grpo_step  # noqa: E402
import bench_limits  # noqa: E402

from benchmarks import harness  # noqa: E402
from rlpost import keys  # noqa: E402

MODES = ("sglang:bare", "sglang:loop", "vllm:bare", "vllm:loop")


def sglang_bare(args: argparse.Namespace, model_dir: Path) -> dict[str, Any]:
    """Median seconds of `engine.generate` per batch size on a bare `sglang.Engine` (rlpost's arguments)."""
    import sglang

    from rlpost.rollout.sglang_args import engine_kwargs, fa3_installed

    cfg = bench_grpo_step.grpo_config(model_dir, args).actor_rollout_ref.rollout
    kwargs = {**engine_kwargs(cfg, str(model_dir), rank=0, base_gpu_id=0, fa3=fa3_installed()),
              "load_format": "auto", "enable_memory_saver": False}
    start = time.perf_counter()
    engine = sglang.Engine(**kwargs)
    res: dict[str, Any] = {"engine_start_s": time.perf_counter() - start, "engine_kwargs": kwargs}
    params = {"temperature": 1.0, "max_new_tokens": args.response_len, "ignore_eos": True}
    for b in args.prompts:
        ids = [row.tolist() for row in bench_limits.random_prompts(b, args.prompt_len) for _ in range(args.n)]
        engine.generate(input_ids=ids[:8], sampling_params={**params, "max_new_tokens": 16})  # warm-up
        counts: list[int] = []

        def run(ids: list[list[int]] = ids, counts: list[int] = counts) -> None:
            outs = engine.generate(input_ids=ids, sampling_params=params)
            counts.append(sum(len(o["output_ids"]) for o in outs))

        seconds, times = bench_limits._median_time(run, args.reps)
        assert set(counts) == {b * args.n * args.response_len}, counts
        res[str(b)] = {"s": seconds, "all_s": times, "gen_tokens_per_s": counts[-1] / seconds}
    engine.shutdown()
    return res


def vllm_bare(args: argparse.Namespace, model_dir: Path) -> dict[str, Any]:
    """`bench_limits.bare_generate` per batch size on a bare vLLM engine."""
    llm, start_s = bench_limits.bare_engine(model_dir, args.prompt_len + args.response_len,
                                            args.gpu_memory_utilization, enforce_eager=False)
    res: dict[str, Any] = {"engine_start_s": start_s}
    for b in args.prompts:
        out = bench_limits.bare_generate(llm, bench_limits.random_prompts(b, args.prompt_len), args.n,
                                         args.response_len, args.reps)
        res[str(b)] = {k: out[k] for k in ("s", "all_s", "gen_tokens_per_s")}
    return res


def loop(args: argparse.Namespace, model_dir: Path, engine: str) -> dict[str, Any]:
    """Median seconds of the worker's `generate_sequences` per batch size (and of GRPO steps with
    `--grpo-step`), rollout.name=`engine`."""
    args.override = [*args.override, f"actor_rollout_ref.rollout.name={engine}"]
    cfg = bench_grpo_step.grpo_config(model_dir, args)
    start = time.perf_counter()
    worker = bench_grpo_step.start_worker(cfg, "cuda")
    res: dict[str, Any] = {"worker_start_s": time.perf_counter() - start}
    for b in args.prompts:
        prompts = bench_limits.random_prompts(b, args.prompt_len)
        batch = bench_grpo_step.prompt_batch(prompts, args.n)
        batch.meta_info.update({keys.META_DO_SAMPLE: True, keys.META_VALIDATE: False})
        worker.generate_sequences(batch)  # warm-up (CUDA graphs, first sync)
        seconds, times = bench_limits._median_time(lambda batch=batch: worker.generate_sequences(batch),
                                                   args.reps)
        res[str(b)] = {"s": seconds, "all_s": times, "gen_tokens_per_s": b * args.n * args.response_len / seconds}
        if args.grpo_step:
            steps = [bench_grpo_step.grpo_step(worker, prompts, args.n) for _ in range(args.reps)]
            res[str(b)]["grpo_step_s"] = sorted(s["step"] for s in steps)[len(steps) // 2]
            res[str(b)]["grpo_steps"] = steps
    return res


def run_child(args: argparse.Namespace) -> None:
    """One measurement (`--child MODE`) in this process; the JSON goes to `--json-out`."""
    engine, kind = args.child.split(":")
    if kind == "bare":
        res = sglang_bare(args, args.model_dir) if engine == "sglang" else vllm_bare(args, args.model_dir)
    else:
        res = loop(args, args.model_dir, engine)
    args.json_out.write_text(json.dumps(res, indent=1, default=str))


def summarize(runs: dict[str, list[dict[str, Any]]], prompts: list[int]) -> dict[str, Any]:
    """Per batch size: median over rounds of each mode's median; loop / bare ratios; SGLang / vLLM."""
    out: dict[str, Any] = {}
    for b in map(str, prompts):
        tps = {}
        for mode, rounds in runs.items():
            values = sorted(r[b]["gen_tokens_per_s"] for r in rounds if b in r)
            if values:
                tps[mode] = values[len(values) // 2]
        row: dict[str, Any] = {"gen_tokens_per_s": tps}
        for engine in ("sglang", "vllm"):
            if f"{engine}:loop" in tps and f"{engine}:bare" in tps:
                row[f"{engine}_loop_over_bare"] = tps[f"{engine}:loop"] / tps[f"{engine}:bare"]
        for kind in ("bare", "loop"):
            if f"sglang:{kind}" in tps and f"vllm:{kind}" in tps:
                row[f"sglang_over_vllm_{kind}"] = tps[f"sglang:{kind}"] / tps[f"vllm:{kind}"]
        out[b] = row
    return out


def child_env(mode: str) -> dict[str, str]:
    """The environment of one measurement: vLLM runs without the SGLang bundle's folder on PYTHONPATH (its
    transformers, flashinfer, tvm_ffi and xgrammar pins differ from the vLLM bundle's)."""
    env = os.environ.copy()
    if mode.startswith("vllm"):
        paths = env.get("PYTHONPATH", "").split(os.pathsep)
        env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p and not os.path.isdir(os.path.join(p, "sglang")))
    return env


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--response-len", type=int, default=512)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=1, help="repeat the processes, alternating their order")
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    ap.add_argument("--grpo-step", action="store_true", help="also time whole GRPO steps in the loop modes")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    ap.add_argument("--tiny", action="store_true", help="tiny model instead of Qwen2.5-0.5B (smoke test)")
    ap.add_argument("--out-dir", type=Path, default=None,
                    help="folder of the result (default benchmarks/results/<date>_<gpu>)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--model-dir", type=Path, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--json-out", type=Path, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    # the settings bench_grpo_step's config reads (its defaults: same fixture)
    defaults = {"fwd_micro": 32, "train_micro": 32, "mini_prompts": 64, "grad_ckpt": 1, "enforce_eager": False,
                "max_num_batched_tokens": 16384, "override": []}
    for key, value in defaults.items():
        setattr(args, key, value)
    return args


def environment() -> dict[str, Any]:
    """The harness's environment plus SGLang's version, read without importing it (that sets up CUDA here)."""
    env = harness.environment()
    try:
        env["sglang"] = importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        env["sglang"] = None
    return env


def build_result(args: argparse.Namespace, runs: dict[str, list[dict[str, Any]]], env: dict[str, Any] | None = None
                 ) -> harness.Result:
    """The harness result of the runs so far: a timing metric per mode and batch size over every round's
    repetitions, each batch's ratios as metrics."""
    res = harness.Result("sglang", harness.command_line(), args.reps * args.rounds, env=env or environment())
    summary = summarize(runs, args.prompts)
    for mode, rounds in runs.items():
        for b in map(str, args.prompts):
            times = [t for r in rounds if b in r for t in r[b]["all_s"]]
            if times:
                res.timing(f"{mode.replace(':', '_')}_{b}_gen_s", times)
    for b, row in summary.items():
        for key, value in row.items():
            if key != "gen_tokens_per_s":
                res.metric(f"{key}_{b}", value, unit="tokens/s ratio (median of rounds)")
    res.extra.update(settings={k: getattr(args, k) for k in (
        "prompts", "n", "prompt_len", "response_len", "reps", "rounds", "gpu_memory_utilization")},
        summary=summary, runs=runs)
    return res


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.child:
        return run_child(args)
    tmp = Path(tempfile.mkdtemp(prefix="bench_sglang_"))
    if args.tiny:
        from rlpost.utils.tiny_model import build_tiny_model

        model_dir = build_tiny_model(tmp / "model")
    else:
        model_dir = bench_limits.build_model(tmp / "model")
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in args.modes}
    env = environment()
    for r in range(args.rounds):
        for mode in (args.modes if r % 2 == 0 else args.modes[::-1]):
            out = tmp / f"{mode.replace(':', '_')}_{r}.json"
            cmd = [sys.executable, __file__, "--child", mode, "--model-dir", str(model_dir), "--json-out", str(out),
                   "--prompts", *map(str, args.prompts), "--n", str(args.n), "--prompt-len", str(args.prompt_len),
                   "--response-len", str(args.response_len), "--reps", str(args.reps),
                   "--gpu-memory-utilization", str(args.gpu_memory_utilization)] + (["--grpo-step"] * args.grpo_step)
            print(f"round {r}: {mode}", flush=True)
            proc = subprocess.run(cmd, env=child_env(mode))
            runs[mode].append(json.loads(out.read_text()) if proc.returncode == 0 else {"failed": proc.returncode})
            print(f"round {r}: {mode}: " + json.dumps({b: round(runs[mode][-1][b]["gen_tokens_per_s"])
                                                       for b in map(str, args.prompts) if b in runs[mode][-1]}),
                  flush=True)
            res = build_result(args, runs, env)
            path = res.write(session=args.out_dir)  # after every process: a time-out keeps what was measured
    print(json.dumps(res.extra["summary"], indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
