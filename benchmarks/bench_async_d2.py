"""Goal D2 (issue 49): fully asynchronous training with partial rollouts against synchronous hybrid and one-step-off,
on a long-tailed workload: the time to train the same samples, and how well the two sides overlap.

    python3 benchmarks/bench_async_d2.py --config sync_hybrid --arch 7b --side-gpus 2 --out-dir $SESSION  # 4 GPUs
    python3 benchmarks/bench_async_d2.py --config fully_async --arch 7b --side-gpus 2 --out-dir $SESSION
    python3 benchmarks/bench_async_d2.py --config fully_async --device cpu --model-dir M --side-gpus 1 \\
        --prompts 4 --n 2 --cap 16 --steps 3 --out-dir /tmp/d2                                        # CPU

One configuration per invocation (one device call each); each adds its run to `<out-dir>/async_d2.json`. Every
configuration is `examples/grpo_trainer/run_qwen2_5_0_5b_gpu.sh` (`--device cpu`: the same script with the CPU
device and the tiny model's sizes) on a random-weight model of `--arch` and `benchmarks/workload.py`'s GSM8K-shaped
prompts with long-tailed per-sample response caps up to `--cap` (4096 by default; `ignore_eos`, so every sample
runs to its cap), the file's order in every run, and the same loss in all three: no reference model and the
engine's log-probs as the PPO old log-probs (`algorithm.rollout_correction.bypass_mode=true`), as asynchronous
systems train:

- `sync_hybrid`: the hybrid engine on all 2 x `--side-gpus` GPUs (generate, then train, every step);
- `one_step_off`: `--side-gpus` trainer GPUs + `--side-gpus` rollout GPUs, the next batch generated while this one
  trains (`trainer.staleness=1`);
- `fully_async`: the same split, verl's v1 `separate_async` mode with partial rollouts (a queue `--warmup` batches
  deep, weights pushed every step, each queued response paused every `--partial-tokens` tokens and resumed with
  the pushed weights), staleness bounded by `--max-staleness` (strategy wait).

Per run: `time_to_samples_s`, from the start of step 1 to the end of step `--steps` (the step-1 metrics line's
arrival less its own time, to the last line's arrival: the same `--steps` x prompts x n samples trained in every
configuration); the step times; for the split configurations the overlap of each step after the first,
step / max(trainer busy, rollout busy) with busy = step - `fully_async/trainer_idle_s` (or `rollout_idle_s`), 1.0
when the busier side never waits. `benchmarks.goals_49` reads the file: D2_time = fully_async / sync_hybrid time to
samples (one-step-off beside it), D2_overlap = the fully-async run's median overlap.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.append(str(Path(__file__).resolve().parent))

from bench_limits import ensure_model  # noqa: E402
from main_ppo_runs import REPO, Run, launch  # noqa: E402

sys.path.append(str(REPO))

from benchmarks import harness  # noqa: E402

RESULT = "async_d2.json"
CONFIGS = ("sync_hybrid", "one_step_off", "fully_async")
PROMPT_LEN = 192  # the workload's prompts are ~70-190 tokens
# The same loss in every configuration: no reference pass, the engine's log-probs as the old log-probs.
LOSS = ["actor_rollout_ref.actor.use_kl_loss=false", "algorithm.rollout_correction.bypass_mode=true",
        "actor_rollout_ref.rollout.calculate_log_probs=true"]


def split_overrides(side_gpus: int) -> list[str]:
    """Trainer on `side_gpus` GPUs (trainer.n_gpus_per_node), the rollout engines on as many more."""
    return ["actor_rollout_ref.hybrid_engine=false", "actor_rollout_ref.rollout.nnodes=1",
            f"actor_rollout_ref.rollout.n_gpus_per_node={side_gpus}",
            "actor_rollout_ref.rollout.free_cache_engine=false", f"trainer.n_gpus_per_node={side_gpus}"]


def config_overrides(config: str, args: argparse.Namespace) -> list[str]:
    """The placement and mode of `config` (shared by the GPU and CPU commands)."""
    if config == "sync_hybrid":
        return [f"trainer.n_gpus_per_node={2 * args.side_gpus}"]
    if config == "one_step_off":
        return [*split_overrides(args.side_gpus), "trainer.staleness=1"]
    if config == "fully_async":
        return [*split_overrides(args.side_gpus), "trainer.v1.trainer_mode=separate_async",
                f"trainer.v1.separate_async.num_warmup_batches={args.warmup}",
                "trainer.v1.separate_async.parameter_sync_step=1",
                "trainer.v1.separate_async.partial_rollout=true",
                f"trainer.v1.separate_async.partial_rollout_tokens={args.partial_tokens}",
                f"trainer.v1.sampler.max_off_policy_threshold={args.max_staleness}",
                "trainer.v1.sampler.max_off_policy_strategy=wait"]
    raise ValueError(f"--config {config}: one of {CONFIGS}")


def workload_overrides(args: argparse.Namespace, data: Path) -> list[str]:
    return [f"data.train_files={data / 'train.parquet'}", "data.val_files=null",
            f"data.train_batch_size={args.prompts}", f"actor_rollout_ref.actor.ppo_mini_batch_size={args.prompts}",
            f"data.max_prompt_length={PROMPT_LEN}", f"data.max_response_length={args.cap}", "data.shuffle=false",
            "actor_rollout_ref.rollout.ignore_eos=true", f"actor_rollout_ref.rollout.n={args.n}",
            "actor_rollout_ref.rollout.tensor_model_parallel_size=1"]


def cpu_overrides() -> list[str]:
    """The GPU example's sizes brought down to the tiny model on CPU worker processes (FSDP_MIN_NUM_PARAMS=0
    leaves the example's small-model GPU settings out)."""
    return ["trainer.device=cpu", "ray_init.num_cpus=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4"]


def command(config: str, args: argparse.Namespace, data: Path, run_dir: Path) -> tuple[list[str], dict[str, str]]:
    cmd = ["bash", "examples/grpo_trainer/run_qwen2_5_0_5b_gpu.sh", *workload_overrides(args, data), *LOSS,
           *config_overrides(config, args), f"trainer.total_training_steps={args.steps}", "trainer.test_freq=-1",
           "trainer.save_freq=-1", "trainer.val_before_train=false", "trainer.logger=[console,file]",
           f"trainer.experiment_name=d2_{config}", f"trainer.default_local_dir={run_dir}",
           *(cpu_overrides() if args.device == "cpu" else []), *args.override]
    gpus = 2 * args.side_gpus if config == "sync_hybrid" else args.side_gpus
    env = {"MODEL_PATH": str(args.model_dir), "DATA_DIR": str(data), "N_GPUS": str(gpus)}
    if args.arch == "7b" or args.device == "cpu":  # one FSDP unit per decoder layer, verl's fixed micro-batches
        env["FSDP_MIN_NUM_PARAMS"] = "0"
    return cmd, env


def time_to_samples(rows: list[dict[str, Any]], arrivals: list[float]) -> float | None:
    """From the start of step 1 (its line's arrival less its own time) to the last step's line."""
    if not rows or len(arrivals) != len(rows):
        return None
    return arrivals[-1] - (arrivals[0] - float(rows[0]["timing_s/step"]))


def overlap(row: dict[str, Any]) -> float | None:
    """step / max(trainer busy, rollout busy) of one split-placement step (None without the idle metrics)."""
    step = row.get("timing_s/step")
    t_idle, r_idle = row.get("fully_async/trainer_idle_s"), row.get("fully_async/rollout_idle_s")
    if step is None or t_idle is None or r_idle is None:
        return None
    busy = max(step - t_idle, step - r_idle)
    return step / busy if busy > 0 else None


def summarize_run(config: str, run: Run, args: argparse.Namespace, log: Path) -> dict[str, Any]:
    rows = run.rows
    out: dict[str, Any] = {"config": config, "rc": run.rc, "timed_out": run.timed_out, "steps_asked": args.steps,
                           "steps_done": len(rows), "log": log.name, "startup_s": run.startup_s,
                           "step_s": [r["timing_s/step"] for r in rows]}
    if len(rows) == args.steps:
        out["time_to_samples_s"] = time_to_samples(rows, run.arrivals)
    later = [v for v in (overlap(r) for r in rows[1:]) if v is not None]
    if later:
        out.update(overlap=later, overlap_median=statistics.median(later))
    for key in ("fully_async/trainer_idle_s", "fully_async/rollout_idle_s", "fully_async/stale_token_fraction",
                "fully_async/partial_samples", "training/policy_staleness", "response_length/mean"):
        vals = [r[key] for r in rows if key in r]
        if vals:
            out[key] = vals
    return out


def build_result(runs: dict[str, dict[str, Any]]) -> harness.Result:
    res = harness.Result("async_d2", harness.command_line(),
                         min((r["steps_done"] for r in runs.values()), default=0))
    for config, run in runs.items():
        if run.get("time_to_samples_s") is not None:
            res.metric(f"{config}_time_to_samples_s", run["time_to_samples_s"], unit="s", steps=run["steps_done"])
        if run["step_s"]:
            res.timing(f"{config}_step_s", run["step_s"])
        if run.get("overlap"):
            res.metric(f"{config}_overlap", run["overlap_median"], min(run["overlap"]), max(run["overlap"]),
                       values=run["overlap"], interval="range of the steps after the first")
    res.extra["runs"] = runs
    return res


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", required=True, choices=CONFIGS)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--arch", default="7b", choices=["0.5b", "7b"], help="the random-weight model (/tmp/m_<arch>)")
    ap.add_argument("--model-dir", type=Path, default=None, help="a model of your own instead of --arch's")
    ap.add_argument("--side-gpus", type=int, default=2, help="GPUs per side (the hybrid run takes both sides')")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--cap", type=int, default=4096, help="the longest response (per-sample caps up to it)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=1, help="fully_async: batches queued ahead (num_warmup_batches)")
    ap.add_argument("--partial-tokens", type=int, default=256, help="fully_async: tokens between pauses")
    ap.add_argument("--max-staleness", type=int, default=2, help="fully_async: sampler.max_off_policy_threshold")
    ap.add_argument("--timeout", type=int, default=520, help="seconds before the run is killed (it keeps its steps)")
    ap.add_argument("--override", nargs="*", default=[], help="extra Hydra overrides")
    ap.add_argument("--out-dir", type=Path, required=True)
    args = ap.parse_args(argv)
    if args.max_staleness < 0:  # parameter_sync_step is 1: the rules ask for a bound >= 0
        ap.error(f"--max-staleness={args.max_staleness}: must be >= 0, e.g. 2")
    return args


def main(argv: list[str] | None = None) -> Path:
    from benchmarks import workload

    args = parse_args(argv)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    if args.model_dir is None:
        args.model_dir = Path(ensure_model(f"/tmp/m_{args.arch}", args.arch))
    data = workload.ensure_parquet("d2_data", args.model_dir, args.prompts, args.n, args.cap, args.seed, args.steps)
    run_dir = Path(f"/tmp/d2_run_{args.config}")
    subprocess.run(["rm", "-rf", str(run_dir)], check=True)
    run_dir.mkdir(parents=True)
    cmd, env = command(args.config, args, data, run_dir)
    log = args.out_dir / f"d2_{args.config}.log"
    run = launch(cmd, env, run_dir, log, f"d2 {args.config}", timeout_s=args.timeout)
    path = args.out_dir / RESULT
    runs = json.loads(path.read_text()).get("runs", {}) if path.is_file() else {}
    runs[args.config] = summarize_run(args.config, run, args, log)
    (args.out_dir / f"d2_{args.config}_metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in run.rows))
    build_result(runs).write(path=path)
    print(f"[d2] {args.config}: {json.dumps(runs[args.config])}\n[d2] -> {path}", flush=True)
    return path


if __name__ == "__main__":
    main()
