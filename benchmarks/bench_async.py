"""Rollout off the critical path on a 2-GPU host: hybrid engine on 2 GPUs vs split placement 1 + 1 (on-policy)
vs one-step-off-policy 1 + 1, same model and batch, at one or more response lengths.

    python benchmarks/bench_async.py --response-lens 512 2048          # on the GPU host (docs/async.md)

Each configuration is one `main_ppo` GRPO run through `examples/grpo_trainer/run_qwen2_5_0_5b_gpu.sh` on a
random-weight Qwen2.5-0.5B-architecture model (`benchmarks/bench_limits.py --save-model`) and the times-ten data,
64 prompts x 8 responses, 512 prompt tokens, `ignore_eos` (every response has the full length). Per run:
seconds per step (median of the steps after the first), the same seen from outside (seconds between consecutive
steps' metrics lines: a wait outside the step's timer would show there), generated tokens per second, and the
fraction of `nvidia-smi` samples (every 0.5 s, both GPUs, between the first and the last step) at 0 % utilisation.
`--prompts` sets the batch, `--gen-heavy` drops the reference model and takes the rollout's log-probs as the old
log-probs (bypass mode) in every configuration. Writes one `benchmarks.harness` result,
`benchmarks/results/<date>_<gpu>/async_<prompts>x<n>[_gen_heavy].json` (or `--json-out`): a
`<config>_<response_len>_step_s` timing metric per run (median, spread, each step after the first), the runs
under `results`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from main_ppo_runs import REPO, launch

sys.path.append(str(REPO))

from benchmarks import harness  # noqa: E402

MODEL, DATA = Path("/tmp/m"), Path("/tmp/d")

SPLIT = ["actor_rollout_ref.hybrid_engine=false", "actor_rollout_ref.rollout.nnodes=1",
         "actor_rollout_ref.rollout.n_gpus_per_node=1", "actor_rollout_ref.rollout.free_cache_engine=false",
         "actor_rollout_ref.rollout.calculate_log_probs=true", "actor_rollout_ref.rollout.gpu_memory_utilization=0.8"]
# Less training per generated token: no reference model (no KL loss) and the rollout's own log-probs as the
# old log-probs (no old_log_prob pass), as asynchronous RL systems train; the same for every placement.
GEN_HEAVY = ["actor_rollout_ref.actor.use_kl_loss=false", "algorithm.rollout_correction.bypass_mode=true",
             "actor_rollout_ref.rollout.calculate_log_probs=true"]
CONFIGS: dict[str, tuple[int, list[str]]] = {  # name: (trainer GPUs, overrides)
    "hybrid_2gpu": (2, []),
    "split_1+1": (1, [*SPLIT, "trainer.staleness=0"]),
    "one_step_off_1+1": (1, [*SPLIT, "trainer.staleness=1"]),
}


def batch_tag(args: argparse.Namespace) -> str:
    """`<prompts>x<n>[_gen_heavy]`: names the runs, logs and results of one batch setting apart."""
    return f"{args.prompts}x{args.n}{'_gen_heavy' if args.gen_heavy else ''}"


def run_one(name: str, response_len: int, args: argparse.Namespace) -> dict[str, Any]:
    gpus, overrides = CONFIGS[name]
    tag = f"{batch_tag(args)}_{response_len}"
    run_dir = Path(f"/tmp/bench_async_{name}_{tag}")
    subprocess.run(["rm", "-rf", str(run_dir)], check=True)
    cmd = ["bash", "examples/grpo_trainer/run_qwen2_5_0_5b_gpu.sh", f"data.train_batch_size={args.prompts}",
           f"data.max_response_length={response_len}", "data.val_files=null",
           "actor_rollout_ref.rollout.ignore_eos=true", "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
           f"actor_rollout_ref.rollout.n={args.n}", f"trainer.total_training_steps={args.steps}",
           f"actor_rollout_ref.actor.ppo_mini_batch_size={min(args.prompts, 64)}",
           "trainer.test_freq=-1", "trainer.save_freq=-1", "trainer.val_before_train=false",
           f"trainer.experiment_name={name}", f"trainer.default_local_dir={run_dir}", *overrides,
           *(GEN_HEAVY if args.gen_heavy else []), *args.override]
    env = {"MODEL_PATH": str(MODEL), "DATA_DIR": str(DATA), "N_GPUS": str(gpus)}
    log = args.log_dir / f"async_{name.replace('+', 'p')}_{tag}.log"
    run = launch(cmd, env, run_dir, log, f"{name} {response_len}")
    rows = run.rows
    if run.rc or len(rows) < 2:
        return {"config": name, "response_len": response_len, "error": f"rc={run.rc}, see {log}"}
    steady = rows[1:]
    step_s = [r["timing_s/step"] for r in steady]
    s_per_step = statistics.median(step_s)
    tokens = args.prompts * args.n * response_len
    return {
        "config": name, "response_len": response_len, "trainer_gpus": gpus, "s_per_step": s_per_step,
        "step_s": step_s,
        "gen_tokens_per_s": tokens / s_per_step,
        "wall_s_per_step": run.wall_s_per_step(),  # the same seen from outside the step's own timer
        "gpu_idle_fraction": run.sampler.idle_fraction(run.arrivals[0], run.arrivals[-1])
        if len(run.arrivals) > 1 else None,
        "phases_s": {k.removeprefix("timing_s/"): statistics.median(r[k] for r in steady)
                     for k in steady[0] if k.startswith("timing_s/")},
        "policy_staleness": [r.get("training/policy_staleness") for r in rows],
    }


def build_result(args: argparse.Namespace, results: list[dict[str, Any]], env: dict[str, Any] | None = None
                 ) -> harness.Result:
    """The harness result of every run (from `run_one`): a step-time metric per configuration and length."""
    res = harness.Result(f"async_{batch_tag(args)}", harness.command_line(), args.steps,
                         env=env or harness.environment())
    for run in results:
        if "step_s" in run:
            res.timing(f"{run['config']}_{run['response_len']}_step_s", run["step_s"],
                       gen_tokens_per_s=run["gen_tokens_per_s"])
    res.extra.update(args=harness.params(args), prompts=args.prompts, n=args.n, gen_heavy=args.gen_heavy,
                     results=results)
    return res


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--response-lens", type=int, nargs="+", default=[512, 2048])
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    ap.add_argument("--gen-heavy", action="store_true", help="no reference model, rollout log-probs as old log-probs")
    ap.add_argument("--override", nargs="*", default=[], help="extra Hydra overrides for every run")
    ap.add_argument("--json-out", type=Path, default=None)
    ap.add_argument("--log-dir", type=Path, default=REPO / "benchmarks" / "results",
                    help="where each run's main_ppo log goes")
    args = ap.parse_args(argv)
    args.log_dir.mkdir(parents=True, exist_ok=True)
    if not MODEL.is_dir():
        subprocess.run([sys.executable, "benchmarks/bench_limits.py", "--save-model", str(MODEL)], cwd=REPO, check=True)
    if not DATA.is_dir():
        subprocess.run([sys.executable, "examples/data_preprocess/times_ten.py", "--local_dir", str(DATA)],
                       cwd=REPO, check=True)
    results = []
    for response_len in args.response_lens:
        by_name = {}
        for name in args.configs:
            by_name[name] = run_one(name, response_len, args)
            print(json.dumps(by_name[name]), flush=True)
        hybrid, off = by_name.get("hybrid_2gpu", {}), by_name.get("one_step_off_1+1", {})
        if "s_per_step" in hybrid and "s_per_step" in off:
            wall = (f"{off['wall_s_per_step'] / hybrid['wall_s_per_step']:.2f}"
                    if off["wall_s_per_step"] and hybrid["wall_s_per_step"] else "n/a")
            print(f"{response_len}: one-step-off / hybrid step time = {off['s_per_step'] / hybrid['s_per_step']:.2f}"
                  f" (wall clock between steps: {wall})")
        results.extend(by_name.values())
    print(f"wrote {build_result(args, results).write(path=args.json_out)}")


if __name__ == "__main__":
    main()
