"""GRPO through `main_ppo` on 1, 2 and 4 GPUs of one host (issue 18 §7): weak scaling of the 0.5B
architecture and a 7B-architecture full fine-tune with rollout TP 1/2/4.

    python3 benchmarks/bench_scale.py --arch 0.5b --gpus 1 2 4 --prompts-per-gpu 64      # weak scaling
    python3 benchmarks/bench_scale.py --arch 7b --gpus 4 --tps 1 2 4 --prompts 32 --steps 4 \
        --override actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8

Each run is `examples/grpo_trainer/run_qwen2_5_0_5b_gpu.sh` (KL loss against a reference, 512 + 512 tokens with
ignore_eos, n=8) on a random-weight model of the chosen architecture (`bench_limits.build_model`) and the
times-ten data; one optimizer step per training step (the mini-batch is the whole batch), so with
`--prompts-per-gpu` every GPU does the same work at every GPU count. Step 1 warms up; medians (and the range) of
the later steps are reported per phase, with the peak memory per phase, and, for weak scaling, the efficiency
t(1 GPU) / t(N GPUs) of the step and of each phase (what grows with the GPU count). `--profile-step S` traces
step S on every rank (left out of the medians) and prints `scripts/trace_summary.py`'s table of it.
Writes one `benchmarks.harness` result, `benchmarks/results/<date>_<gpu>/scale_<arch>.json` (or `--json-out`),
rewritten after every run: a `<gpus>gpu_tp<tp>_<prompts>x<n>_step_s` timing metric per run (median, spread,
each measured step), the rows under `results`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.append(str(Path(__file__).resolve().parents[1] / "scripts"))  # trace_summary

from bench_limits import ensure_model  # noqa: E402
from main_ppo_runs import REPO, launch  # noqa: E402

sys.path.append(str(REPO))

from benchmarks import harness  # noqa: E402

DATA = Path("/tmp/d")


def model_dir(arch: str) -> Path:
    """The random-weight model of `arch`, built once per host."""
    return ensure_model(f"/tmp/m_{arch}", arch)


def summarize(rows: list[dict[str, Any]], profiled_step: int | None = None) -> dict[str, Any]:
    """Medians and ranges of the steps after the first (warm-up), less the profiled one; `{"steps_measured": 0}`
    when none is left."""
    steady = [r for i, r in enumerate(rows, start=1) if r.get("step", i) not in (1, profiled_step)]
    if not steady:
        return {"steps_measured": 0}
    def med(key: str) -> float:
        return statistics.median(r[key] for r in steady if key in r)
    steps = [r["timing_s/step"] for r in steady]
    return {
        "steps_measured": len(steady),
        "s_per_step": statistics.median(steps), "s_per_step_range": [min(steps), max(steps)], "step_s": steps,
        "phases_s": {k.removeprefix("timing_s/"): med(k) for k in steady[0] if k.startswith("timing_s/")},
        "tokens_per_s_per_gpu": med("perf/throughput"),
        "peak_allocated_gb": {k.removeprefix("perf/max_memory_allocated_gb").lstrip("/") or "step": max(
            r[k] for r in steady if k in r) for k in steady[0] if k.startswith("perf/max_memory_allocated_gb")},
    }


def profile_overrides(step: int | None, run_dir: Path) -> list[str]:
    """A torch trace of every rank of the actor (with its rollout) and the reference at `step`."""
    if not step:
        return []
    return ["global_profiler.tool=torch", f"global_profiler.steps=[{step}]",
            f"global_profiler.save_path={run_dir / 'profile'}",
            *(f"actor_rollout_ref.{role}.profiler.{key}" for role in ("actor", "ref")
              for key in ("enable=true", "all_ranks=true"))]


def summarize_traces(folder: Path, step: int, label: Path) -> list[dict[str, Any]] | None:
    """scripts/trace_summary.py over the ranks' traces of `step`; its table is printed and written beside the
    run's log (`<label>.trace.txt`)."""
    import trace_summary

    paths = sorted(folder.glob(f"step{step}_*_rank*.json"))
    if not paths:
        return None
    ranks = trace_summary.summarize_files(paths)
    table = trace_summary.format_table(ranks)
    Path(f"{label}.trace.txt").write_text(table + "\n")
    print(table, flush=True)
    return ranks


REALISTIC_PROMPT_LEN = 192  # the workload's prompts are ~70-190 tokens (benchmarks/workload.py)


def realistic_data(arch: str, prompts: int, args: argparse.Namespace, tokenizer_dir: Path | None = None) -> Path:
    """The GSM8K-shaped workload for this batch (every step's prompts in file order, per-sample response caps in
    `extra_info.response_caps`, long-tailed up to `--cap`), written once per shape."""
    from benchmarks import workload

    out = Path(f"/tmp/d_realistic_{arch}_{prompts}x{args.n}_cap{args.cap}_s{args.steps}_seed{args.seed}")
    if not (out / "train.parquet").exists():
        workload.main(["--prompts", str(prompts), "--n", str(args.n), "--cap", str(args.cap), "--seed",
                       str(args.seed), "--steps", str(args.steps), "--tokenizer", str(tokenizer_dir or model_dir(arch)),
                       "--out", str(out)])
    return out


def workload_overrides(args: argparse.Namespace) -> list[str]:
    """The lengths of `--workload`: fixed (every response `--response-len`) or realistic (prompt lengths and
    per-sample caps from the file, the file's order kept so every run trains on the same prompts)."""
    if args.workload == "realistic":
        return [f"data.max_prompt_length={REALISTIC_PROMPT_LEN}", f"data.max_response_length={args.cap}",
                "data.shuffle=false"]
    return [f"data.max_response_length={args.response_len}"]


def run_one(arch: str, gpus: int, tp: int, prompts: int, args: argparse.Namespace) -> dict[str, Any]:
    name = f"scale_{arch}_{gpus}gpu_tp{tp}_{prompts}x{args.n}" + ("_realistic" if args.workload == "realistic" else "")
    run_dir = Path(f"/tmp/{name}")
    subprocess.run(["rm", "-rf", str(run_dir)], check=True)
    cmd = ["bash", "examples/grpo_trainer/run_qwen2_5_0_5b_gpu.sh", f"data.train_batch_size={prompts}",
           f"actor_rollout_ref.actor.ppo_mini_batch_size={prompts}", *workload_overrides(args),
           "data.val_files=null", "actor_rollout_ref.rollout.ignore_eos=true",
           f"actor_rollout_ref.rollout.tensor_model_parallel_size={tp}", f"actor_rollout_ref.rollout.n={args.n}",
           f"trainer.total_training_steps={args.steps}", "trainer.test_freq=-1", "trainer.save_freq=-1",
           "trainer.val_before_train=false", f"trainer.experiment_name={name}",
           f"trainer.default_local_dir={run_dir}", *profile_overrides(args.profile_step, run_dir), *args.override]
    data = realistic_data(arch, prompts, args) if args.workload == "realistic" else DATA
    env = {"MODEL_PATH": str(model_dir(arch)), "DATA_DIR": str(data), "N_GPUS": str(gpus)}
    if arch == "7b":  # one FSDP unit per decoder layer: the example's one-unit wrapping is for the 0.5B model
        env["FSDP_MIN_NUM_PARAMS"] = "0"
    run = launch(cmd, env, run_dir, args.log_dir / f"{name}.log", name, timeout_s=args.timeout)
    row: dict[str, Any] = {"arch": arch, "gpus": gpus, "tp": tp, "prompts": prompts, "n": args.n,
                           "workload": args.workload, "response_len": args.response_len if args.workload == "fixed"
                           else f"per-sample caps up to {args.cap}", "rc": run.rc, "wall_s": run.wall_s,
                           "timed_out": run.timed_out, "startup_s": run.startup_s}
    if len(run.rows) >= 2:
        row.update(summarize(run.rows, args.profile_step))
    if args.profile_step:
        row["trace_summary"] = summarize_traces(run_dir / "profile", args.profile_step, args.log_dir / f"{name}")
    if run.rc or "s_per_step" not in row:
        row["error"] = f"rc={run.rc}, {len(run.rows)} steps logged: see {args.log_dir / (name + '.log')}"
    return row


def efficiency(results: list[dict[str, Any]]) -> None:
    """Weak scaling: t(1 GPU) / t(N GPUs) for the step and each phase, beside each multi-GPU row."""
    base = next((r for r in results if r["gpus"] == 1 and "s_per_step" in r and "error" not in r), None)
    if base is None:
        return
    for r in results:
        if "s_per_step" in r and "error" not in r and r is not base and r["prompts"] == base["prompts"] * r["gpus"]:
            r["weak_efficiency"] = base["s_per_step"] / r["s_per_step"]
            r["phase_efficiency"] = {k: base["phases_s"][k] / v for k, v in r["phases_s"].items()
                                     if base["phases_s"].get(k, 0) > 0.05 and v > 0}


def build_result(args: argparse.Namespace, results: list[dict[str, Any]], env: dict[str, Any] | None = None
                 ) -> harness.Result:
    """The harness result of the rows so far (from `run_one`): a step-time metric per measured run."""
    res = harness.Result(f"scale_{args.arch}", harness.command_line(), args.steps, env=env or harness.environment())
    for r in results:
        if "step_s" in r:
            wl = "_realistic" if r.get("workload") == "realistic" else ""
            res.timing(f"{r['gpus']}gpu_tp{r['tp']}_{r['prompts']}x{r['n']}{wl}_step_s", r["step_s"],
                       tokens_per_s_per_gpu=r["tokens_per_s_per_gpu"], weak_efficiency=r.get("weak_efficiency"))
    res.extra.update(args=harness.params(args), results=results)
    return res


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", choices=["0.5b", "7b"], default="0.5b")
    ap.add_argument("--gpus", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--tps", type=int, nargs="+", default=[1], help="rollout tensor-parallel sizes to run")
    group = ap.add_mutually_exclusive_group()
    group.add_argument("--prompts-per-gpu", type=int, default=None, help="weak scaling: prompts = this x GPUs")
    group.add_argument("--prompts", type=int, default=None, help="the same batch at every GPU count")
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--response-len", type=int, default=512, help="every response's length (--workload fixed)")
    ap.add_argument("--workload", choices=["fixed", "realistic"], default="fixed",
                    help="fixed: 28-token prompts, every response --response-len (ignore_eos); realistic: the "
                         "GSM8K-shaped prompts and long-tailed per-sample caps of benchmarks/workload.py")
    ap.add_argument("--cap", type=int, default=1024, help="the realistic workload's response cap")
    ap.add_argument("--seed", type=int, default=0, help="the realistic workload's seed")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--timeout", type=int, default=540, help="seconds per run")
    ap.add_argument("--profile-step", type=int, default=None,
                    help="trace this step on every rank (left out of the medians) and summarize where its time went")
    ap.add_argument("--override", nargs="*", default=[], help="extra Hydra overrides for every run")
    ap.add_argument("--json-out", type=Path, default=None)
    ap.add_argument("--log-dir", type=Path, default=REPO / "benchmarks" / "results")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    args.log_dir.mkdir(parents=True, exist_ok=True)
    if not DATA.is_dir():
        subprocess.run([sys.executable, "examples/data_preprocess/times_ten.py", "--local_dir", str(DATA)],
                       cwd=REPO, check=True)
    env = harness.environment()
    out = args.json_out or harness.session_dir(harness.RESULTS, env) / f"scale_{args.arch}.json"
    results = []
    for gpus in args.gpus:
        for tp in args.tps:
            if gpus % tp:
                continue
            prompts = args.prompts if args.prompts else (args.prompts_per_gpu or 64) * gpus
            results.append(run_one(args.arch, gpus, tp, prompts, args))
            print(json.dumps(results[-1]), flush=True)
            efficiency(results)  # written after every run: a later run cut short loses nothing before it
            build_result(args, results, env).write(path=out)
    for r in results:
        if "error" not in r:
            eff = f", weak-scaling efficiency {r['weak_efficiency']:.2f}" if "weak_efficiency" in r else ""
            print(f"{r['gpus']} GPU(s) TP {r['tp']} {r['prompts']}x{r['n']}: {r['s_per_step']:.2f} s/step, "
                  f"{r['tokens_per_s_per_gpu']:.0f} tokens/s per GPU{eff}")
        else:
            print(f"{r['gpus']} GPU(s) TP {r['tp']}: {r['error']}")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
