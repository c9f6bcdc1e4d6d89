"""GRPO with LoRA against full fine-tuning on one GPU, through `main_ppo` (the user's path): step time, per-phase
time, peak memory and weight-sync time, per mode, on random-weight Qwen2.5 architectures.

    python3 benchmarks/bench_lora.py --arch 0.5b --modes full lora_adapter lora_merged --steps 6
    python3 benchmarks/bench_lora.py --arch 7b --modes lora_adapter --steps 3 --prompts 16 --micro 8
    python3 benchmarks/bench_lora.py --arch 7b --modes lora_adapter --limits --steps 3 --prompts 8 --micro 8 \
        --response-len 256 --enforce-eager 1        # goal E2 (benchmarks/gpu_session_e.sh)

Modes: `full` (all weights train), `lora_adapter` (rank-`--rank` all-linear adapters, vLLM serves the adapter,
`model.lora.merge=false`), `lora_merged` (the adapter folded into full weights at each sync). Each mode is one
run of `examples/grpo_trainer/run_qwen2_5_0_5b_gpu.sh` (the GPU example, 512 + 512 tokens, ignore_eos,
KL loss, so a reference policy is computed); the first step (warm-up) is left out of the medians. One
`benchmarks.harness` result goes to `benchmarks/results/<date>_<gpu>/lora_<arch>.json` (or `--out`), rewritten
after each mode: a `<mode>_<phase>_s` timing metric per mode and phase, the runs under `runs`
(docs/benchmarks/lora.md). With `--limits`, `benchmarks/lora_limits.py` runs first in its own process on the same
model, prompts (the first rows of the data) and lengths, and goal E2 is the `lora_adapter` run's step time over the
sum of those limits: the geometric mean of the measured steps' ratios with its 95 % interval (the limits are one
median each, timed before the run). `--dry-run` prints the commands and runs nothing.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.append(str(REPO))
sys.path.append(str(REPO / "benchmarks"))

from benchmarks import harness  # noqa: E402

MODES = {
    "full": [],
    "lora_adapter": ["actor_rollout_ref.model.lora.merge=false"],
    "lora_merged": ["actor_rollout_ref.model.lora.merge=true"],
}
E2_TARGET = "<= 1.15"
PHASES = ("timing_s/step", "timing_s/gen", "timing_s/old_log_prob", "timing_s/ref", "timing_s/update_actor",
          "timing_s/update_weights", "timing_s/update_weights_wake", "timing_s/update_weights_adapter",
          "timing_s/gen_wake", "timing_s/gen_engine", "timing_s/gen_sleep")  # the parts: where a gap sits


def run_mode(mode: str, args: argparse.Namespace, model: Path, data: Path, out: Path, timeout_s: float) -> dict:
    """One `main_ppo` run of `mode` (killed with its process group and Ray past `timeout_s`), read back."""
    from main_ppo_runs import launch

    run_dir = Path(f"/tmp/run_lora_{args.arch}_{mode}")
    shutil.rmtree(run_dir, ignore_errors=True)  # metrics.jsonl is appended to: start each run empty
    cmd = mode_command(mode, args, run_dir)
    env = {"MODEL_PATH": str(model), "DATA_DIR": str(data), "N_GPUS": "1"}
    # the example's default (the whole model one FSDP unit, one exposed gather per pass) suits 0.5B; 7B gets verl's
    # unit per decoder layer, whose gathers overlap the layers' compute
    units = args.fsdp_min_num_params if args.fsdp_min_num_params is not None else 0 if args.arch == "7b" else None
    if units is not None:
        env["FSDP_MIN_NUM_PARAMS"] = str(units)
    if args.dry_run:
        print(" ".join(f"{k}={v}" for k, v in env.items()) + " " + " ".join(cmd), flush=True)
        return {"mode": mode, "dry_run": True}
    log = out.with_suffix(f".{mode}.log")
    run = launch(cmd, env, run_dir, log, f"lora {mode}", timeout_s=timeout_s)
    result = read_run(mode, run.rc, run.wall_s, run_dir, log)
    result["timed_out"] = run.timed_out  # the steps logged before the limit still count
    return result


def mode_command(mode: str, args: argparse.Namespace, run_dir: Path) -> list[str]:
    """The `main_ppo` launch of one mode: the GPU example with the benchmark's batch, lengths and LoRA keys."""
    budgets = []
    if args.token_budgets:  # the limits' micro-batching: packed rows of up to --train-tokens / --fwd-tokens, fused head
        from bench_realistic import worker_overrides

        budgets = worker_overrides(argparse.Namespace(train_tokens=args.train_tokens, fwd_tokens=args.fwd_tokens,
                                                      override=[]), liger=False)
    lora = [] if mode == "full" else [f"actor_rollout_ref.model.lora_rank={args.rank}",
                                      f"actor_rollout_ref.model.lora_alpha={2 * args.rank}",
                                      "actor_rollout_ref.actor.optim.lr=1e-5"]
    return ["bash", "examples/grpo_trainer/run_qwen2_5_0_5b_gpu.sh",
           f"data.train_batch_size={args.prompts}", f"data.max_response_length={args.response_len}",
           "data.val_files=null", f"actor_rollout_ref.rollout.enforce_eager={str(bool(args.enforce_eager)).lower()}",
           f"actor_rollout_ref.actor.ppo_mini_batch_size={args.prompts}",
           f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={args.micro}",
           f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={args.micro}",
           f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={args.micro}",
           f"actor_rollout_ref.rollout.gpu_memory_utilization={args.gpu_memory_utilization}",
           "actor_rollout_ref.rollout.ignore_eos=true", f"trainer.total_training_steps={args.steps}",
           "trainer.test_freq=-1", "trainer.save_freq=-1", "trainer.val_before_train=false",
           f"trainer.experiment_name=lora_{mode}", f"trainer.default_local_dir={run_dir}", *lora, *MODES[mode],
           *budgets, *args.override]


def read_run(mode: str, rc: int, wall_s: float, run_dir: Path, log: Path) -> dict:
    """One mode's result from its `metrics.jsonl`: each phase's spread over steps 2..N, peak memory; a failed run,
    or one with no metrics, keeps its log's tail (the steps a killed run logged still count)."""
    from main_ppo_runs import step_times

    result: dict = {"mode": mode, "rc": rc, "wall_s": round(wall_s, 1)}
    rows = step_times(run_dir / "metrics.jsonl")  # a line cut off by a kill is left out
    if rc != 0 or not rows:
        result["log_tail"] = log.read_text()[-3000:] if log.exists() else ""
    if not rows:
        return result
    steps = [r for r in rows if "timing_s/step" in r][1:]  # step 1 warms up (CUDA graphs, allocator)
    result["steps_measured"] = len(steps)
    for key in PHASES:
        vals = [r[key] for r in steps if key in r]
        if vals:
            result[key] = {**harness.spread(vals), "all": vals}
    for key in ("perf/max_memory_allocated_gb", "perf/max_memory_reserved_gb"):
        result[key] = round(max(r.get(key, 0.0) for r in rows), 2)
    prompt_means = [r["prompt_length/mean"] for r in rows if "prompt_length/mean" in r]
    if prompt_means:
        result["prompt_length_mean"] = sum(prompt_means) / len(prompt_means)
    return result


def e2_goal(res: harness.Result, runs: list[dict[str, Any]], limits: dict[str, Any] | None) -> None:
    """Goal E2: the `lora_adapter` run's measured steps over the limits' sum (`lora_limits.json`), into `res`."""
    run = next((r for r in runs if r["mode"] == "lora_adapter" and "timing_s/step" in r), None)
    if limits is None or run is None:
        res.not_measured("E2", E2_TARGET, "no lora_limits result" if limits is None else
                         "the lora_adapter run logged no measured step (see its log_tail under runs)")
        return
    total = limits["metrics"]["sum_s"]["value"]
    stats = harness.geomean_ci([s / total for s in run["timing_s/step"]["all"]])
    res.metric("lora_adapter_step_over_sum_limits", **{k: stats[k] for k in ("value", "ci_low", "ci_high", "values")},
               unit="step / sum of limits")
    parts = {k: limits["metrics"][f"{k}_s"]["value"] for k in ("gen", "fwd", "ref", "train")}
    res.goal("E2", stats, E2_TARGET, reps=len(stats["values"]), limits_sum_s=total, limits=parts,
             limits_prompt_mean=limits.get("prompt_mean"), run_prompt_mean=run.get("prompt_length_mean"))


def build_result(args: argparse.Namespace, runs: list[dict[str, Any]], env: dict[str, Any] | None = None,
                 limits: dict[str, Any] | None = None) -> harness.Result:
    """The harness result of the finished `runs` (from `run_mode`): one timing metric per mode and phase; with
    `--limits`, goal E2 from `limits` (a `lora_limits` result read back, None when it did not finish)."""
    res = harness.Result(f"lora_{args.arch}", harness.command_line(), args.steps, env=env or harness.environment())
    for run in runs:
        for key in PHASES:
            if key in run:
                res.timing(f"{run['mode']}_{key.removeprefix('timing_s/')}_s", run[key]["all"])
    if args.limits:
        e2_goal(res, runs, limits)
    res.extra.update(args=harness.params(args), arch=args.arch, rank=args.rank, prompts=args.prompts, n=8,
                     prompt_len=512, response_len=args.response_len, runs=runs, limits=limits)
    return res


def limits_command(args: argparse.Namespace, model: Path, data: Path, out: Path) -> list[str]:
    """`benchmarks/lora_limits.py` on the run's model, prompts, lengths and engine settings."""
    return [sys.executable, "-m", "benchmarks.lora_limits", "--model-dir", str(model), "--data",
            str(data / "train.parquet"), "--prompts", str(args.prompts), "--n", "8", "--response-len",
            str(args.response_len), "--rank", str(args.rank), "--reps", str(args.limit_reps), "--enforce-eager",
            str(args.enforce_eager), "--gpu-memory-utilization", str(args.gpu_memory_utilization),
            "--fwd-tokens", str(args.fwd_tokens), "--train-tokens", str(args.train_tokens), "--json-out", str(out)]


def run_limits(args: argparse.Namespace, model: Path, data: Path, out: Path, timeout_s: float
               ) -> dict[str, Any] | None:
    """The limits in their own process (a fresh CUDA context, freed on exit); their result, or None."""
    cmd = limits_command(args, model, data, out)
    if args.dry_run:
        print(" ".join(cmd), flush=True)
        return None
    out.unlink(missing_ok=True)
    try:
        with open(out.with_suffix(".log"), "w") as f:
            subprocess.run(cmd, cwd=REPO, stdout=f, stderr=subprocess.STDOUT, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        print(f"[lora] lora_limits ran past {timeout_s:.0f} s", flush=True)
    return json.loads(out.read_text()) if out.exists() else None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", choices=["0.5b", "7b"], default="0.5b")
    ap.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES))
    ap.add_argument("--rank", type=int, default=32)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--micro", type=int, default=32, help="rows per micro-batch (unused with --token-budgets 1)")
    ap.add_argument("--token-budgets", type=int, default=0,
                    help="1: the runs pack micro-batches by tokens as the limits do (use_dynamic_bsz, --train-tokens "
                         "/ --fwd-tokens, the fused log-prob head); 0: --micro rows each")
    ap.add_argument("--fwd-tokens", type=int, default=32768, help="token budget of a log-prob micro-batch (limits)")
    ap.add_argument("--train-tokens", type=int, default=16384, help="token budget of an update micro-batch (limits)")
    ap.add_argument("--fsdp-min-num-params", type=int, default=None,
                    help="the example's FSDP_MIN_NUM_PARAMS (default: 0, a unit per decoder layer, for 7b; the "
                         "example's own else)")
    ap.add_argument("--response-len", type=int, default=512, help="data.max_response_length (ignore_eos)")
    ap.add_argument("--enforce-eager", type=int, default=0, help="vLLM without CUDA graphs (run and limits)")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    ap.add_argument("--timeout", type=int, default=900, help="seconds: each run's limit, and the whole budget")
    ap.add_argument("--limits", action="store_true", help="run lora_limits first; goal E2")
    ap.add_argument("--limit-reps", type=int, default=2)
    ap.add_argument("--limits-timeout", type=int, default=150)
    ap.add_argument("--model-dir", type=Path, default=None, help="default /tmp/model_<arch> (built when missing)")
    ap.add_argument("--data-dir", type=Path, default=Path("/tmp/d"), help="times_ten data (built when missing)")
    ap.add_argument("--override", nargs="*", default=[], help="extra main_ppo overrides of every run")
    ap.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    ap.add_argument("--out", type=Path, default=None)
    return ap.parse_args(argv)


def prepare(args: argparse.Namespace) -> tuple[Path, Path]:
    """The model (random weights of `--arch`, built on the GPU) and the data, each made when missing."""
    model = args.model_dir or Path(f"/tmp/model_{args.arch}")
    if not (model / "config.json").exists() and not args.dry_run:
        import torch
        from bench_limits import build_model

        start = time.perf_counter()
        build_model(model, arch=args.arch)
        print(f"[lora] built {args.arch} model in {time.perf_counter() - start:.0f} s", flush=True)
        torch.cuda.empty_cache()
    data = args.data_dir
    if not (data / "train.parquet").exists() and not args.dry_run:
        subprocess.run([sys.executable, "examples/data_preprocess/times_ten.py", "--local_dir", str(data)],
                       cwd=REPO, check=True, capture_output=True)
    return model, data


def main(argv: list[str] | None = None) -> Path:
    args = parse_args(argv)
    deadline = time.perf_counter() + args.timeout
    model, data = prepare(args)
    # a dry run skips the environment capture (it imports torch and vLLM)
    env = {"date": time.strftime("%Y-%m-%d"), "gpu": "cpu"} if args.dry_run else harness.environment()
    out = args.out or harness.session_dir(harness.RESULTS, env) / f"lora_{args.arch}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    limits = None
    if args.limits:
        budget = min(args.limits_timeout, deadline - time.perf_counter())
        limits = run_limits(args, model, data, out.with_name(f"lora_limits_{args.arch}.json"), budget)
    runs: list[dict[str, Any]] = []
    for mode in args.modes:
        runs.append(run_mode(mode, args, model, data, out, max(deadline - time.perf_counter(), 30)))
        print(json.dumps({k: v for k, v in runs[-1].items() if k != "log_tail"}), flush=True)
        if not args.dry_run:  # each finished mode, even if a later one runs out of time
            build_result(args, runs, env, limits).write(path=out)
    print(f"[lora] wrote {out}" if not args.dry_run else "[lora] dry run: nothing run", flush=True)
    return out


if __name__ == "__main__":
    main()
