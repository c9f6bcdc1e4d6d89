"""Why generation inside `main_ppo` is slower than bare vLLM (issue 18 §5): one difference at a time.

    python3 benchmarks/bench_gen_ablate.py --model-dir /tmp/m --prompts 64 --n 8 --prompt-len 28 --reps 5

Two engines, each in its own subprocess, one after the other, on the same model and GPU:
  - bare: vLLM's defaults, as `bench_limits.py` builds its limit (`bare_engine`);
  - rlpost: exactly the keyword arguments rlpost's rollout passes (`rlpost.rollout.vllm.engine_kwargs` of the
    package's config with the GPU example's rollout overrides, `--override` for more).
Within an engine the request shapes alternate round-robin, `--reps` rounds, each generation of exactly
`--response-len` tokens (ignore_eos):
  - n8: P requests with `SamplingParams(n=8)` (the bare limit's shape);
  - rows: P x n requests with n=1 and rlpost's `sampling_params` (rlpost's shape);
  - rows_tqdm: the same with the progress bar rlpost shows on rank 0;
  - rows_after_sleep (engines with sleep mode): a level-2 sleep, weights wake-up + `load_weights`, KV wake-up
    (rlpost's cycle around each update), then rows.
Writes one `benchmarks.harness` result, `benchmarks/results/<date>_<gpu>/gen_ablate.json` (or `--json-out`): a
`<engine>_<shape>_s` timing metric per engine and shape (median, spread, every repetition), each engine's start-up
time, kwargs and summaries under `engines`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.append(str(REPO))

from benchmarks import harness  # noqa: E402

EXAMPLE_ROLLOUT = [  # the GPU example's rollout keys (examples/common.sh) with gpu_grpo_e2e.sh's 512 + 512 lengths
    "actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.gpu_memory_utilization=0.6",
    "actor_rollout_ref.rollout.enforce_eager=false", "actor_rollout_ref.rollout.max_num_batched_tokens=16384",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=1", "data.max_prompt_length=512",
    "data.max_response_length=512",
]


def rlpost_kwargs(model_dir: Path, overrides: list[str]) -> dict[str, Any]:
    """`vllm.LLM` kwargs rlpost's rollout builds for the package config + the example's + `overrides`."""
    from hydra import compose, initialize_config_module

    from rlpost.rollout.vllm import engine_kwargs

    with initialize_config_module("rlpost.trainer.config", version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=[*EXAMPLE_ROLLOUT, *overrides])
    return engine_kwargs(cfg.actor_rollout_ref.rollout, str(model_dir), "cuda")


def shapes(llm: Any, prompts: list[list[int]], n: int, response_len: int, sleep: bool
           ) -> dict[str, tuple[Any, Any]]:
    """name -> (untimed preparation or None, generation returning its token count) for each request shape."""
    import bench_limits
    from vllm import SamplingParams

    from rlpost.rollout.base import SamplingSpec
    from rlpost.rollout.vllm import sampling_params

    spec = SamplingSpec(max_tokens=response_len, temperature=1.0, top_k=-1, top_p=1.0, greedy=False,
                        ignore_eos=True, logprobs=False)
    rows_params = sampling_params(spec, set())
    n8_params = SamplingParams(n=n, temperature=1.0, max_tokens=response_len, ignore_eos=True, detokenize=False)
    rows = [{"prompt_token_ids": p} for p in prompts for _ in range(n)]
    grouped = [{"prompt_token_ids": p} for p in prompts]

    def count(outs: Any) -> int:
        return sum(len(c.token_ids) for o in outs for c in o.outputs)

    def rows_gen() -> int:
        return count(llm.generate(rows, rows_params, use_tqdm=False))

    out = {
        "n8": (None, lambda: count(llm.generate(grouped, n8_params, use_tqdm=False))),
        "rows": (None, rows_gen),
        "rows_tqdm": (None, lambda: count(llm.generate(rows, rows_params, use_tqdm=True))),
    }
    if sleep:
        weights = bench_limits.weights_on_gpu(Path(llm.llm_engine.model_config.model))

        def sleep_cycle() -> None:  # rlpost's cycle around an update (rlpost.rollout.vllm), untimed
            llm.sleep(level=2)
            llm.wake_up(tags=["weights"])
            llm.collective_rpc(lambda worker: worker.model_runner.model.load_weights(iter(weights.items())))
            llm.wake_up(tags=["kv_cache"])

        out["rows_after_sleep"] = (sleep_cycle, rows_gen)
    return out


def run_engine(args: argparse.Namespace) -> dict[str, Any]:
    """One engine (args.engine), every shape `args.reps` times round-robin; seconds per repetition."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    import bench_limits
    from vllm import LLM, SamplingParams

    if args.engine == "bare":
        llm, start_s = bench_limits.bare_engine(args.model_dir, args.prompt_len + args.response_len,
                                                args.gpu_memory_utilization, enforce_eager=False)
        kwargs: dict[str, Any] = {"defaults": True, "gpu_memory_utilization": args.gpu_memory_utilization}
    else:
        kwargs = rlpost_kwargs(args.model_dir, args.override)
        t0 = time.perf_counter()
        llm = LLM(**kwargs)
        start_s = time.perf_counter() - t0
    sleep = bool(kwargs.get("enable_sleep_mode", args.engine == "bare"))
    prompts = bench_limits.random_prompts(args.prompts, args.prompt_len, seed=args.prompts).tolist()
    runs = shapes(llm, prompts, args.n, args.response_len, sleep)
    llm.generate([{"prompt_token_ids": prompts[0]}], SamplingParams(max_tokens=16, ignore_eos=True, detokenize=False),
                 use_tqdm=False)  # warm-up
    times: dict[str, list[float]] = {name: [] for name in runs}
    expected = args.prompts * args.n * args.response_len
    for _ in range(args.reps):
        for name, (prepare, generate) in runs.items():
            if prepare is not None:
                prepare()
            seconds, tokens = harness.timed(generate, bench_limits.sync)
            assert tokens == expected, (name, tokens, expected)
            times[name].append(seconds)
            print(f"[gen_ablate] {args.engine} {name}: {seconds:.2f} s", flush=True)
    return {"engine_start_s": start_s, "kwargs": {k: v for k, v in kwargs.items() if k != "model"},
            "shapes": {name: shape_summary(t) for name, t in times.items()}}


def shape_summary(t: list[float]) -> dict[str, Any]:
    """One shape's repetitions: median, quartiles, range (harness.spread) and every time, in seconds."""
    sp = harness.spread(t)
    return {"median_s": sp["median"], "q1_s": sp["q1"], "q3_s": sp["q3"], "min_s": sp["min"], "max_s": sp["max"],
            "all_s": t}


def build_result(args: argparse.Namespace, engines: dict[str, Any], env: dict[str, Any] | None = None
                 ) -> harness.Result:
    """The harness result of each engine's `run_engine` output: one timing metric per engine and shape."""
    res = harness.Result("gen_ablate", harness.command_line(), args.reps, env=env or harness.environment())
    for engine, out in engines.items():
        res.metric(f"{engine}_engine_start_s", out["engine_start_s"], unit="s")
        for name, shape in out["shapes"].items():
            res.timing(f"{engine}_{name}_s", shape["all_s"])
    res.extra.update(args=harness.params(args), engines=engines)
    return res


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-dir", type=Path, required=True, help="a model built by bench_limits --save-model")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=28, help="real prompt tokens (the times-ten data has 28)")
    ap.add_argument("--response-len", type=int, default=512)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.5, help="the bare engine's (bench_limits)")
    ap.add_argument("--engines", nargs="+", default=["bare", "rlpost"], choices=["bare", "rlpost"])
    ap.add_argument("--override", nargs="*", default=[], help="more key=value for the rlpost engine's config")
    ap.add_argument("--engine", choices=["bare", "rlpost"], help=argparse.SUPPRESS)  # the subprocess's own
    ap.add_argument("--json-out", type=Path, default=None)
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.engine:  # subprocess: one engine, its result as the harness's reply line
        harness.reply(run_engine(args))
        return
    engines: dict[str, Any] = {}
    for engine in args.engines:
        cmd = [sys.executable, __file__, *sys.argv[1:], "--engine", engine]
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(harness.TAG)]
        if proc.returncode != 0 or not lines:
            sys.exit(f"{engine} engine failed (rc {proc.returncode}):\n{proc.stderr[-3000:]}")
        engines[engine] = json.loads(lines[-1][len(harness.TAG):])
        for name, s in engines[engine]["shapes"].items():
            print(f"{engine:7s} {name:17s} {s['median_s']:.2f} s [{s['min_s']:.2f}, {s['max_s']:.2f}]", flush=True)
    print(f"[gen_ablate] wrote {build_result(args, engines).write(path=args.json_out)}")


if __name__ == "__main__":
    main()
