"""GRPO with LoRA against full fine-tuning on one GPU, through `main_ppo` (the user's path): step time, per-phase
time, peak memory and weight-sync time, per mode, on random-weight Qwen2.5 architectures.

    python3 benchmarks/bench_lora.py --arch 0.5b --modes full lora_adapter lora_merged --steps 6
    python3 benchmarks/bench_lora.py --arch 7b --modes lora_adapter --steps 3 --prompts 16 --micro 8

Modes: `full` (all weights train), `lora_adapter` (rank-`--rank` all-linear adapters, vLLM serves the adapter,
`model.lora.merge=false`), `lora_merged` (the adapter folded into full weights at each sync). Each mode is one
run of `examples/grpo_trainer/run_qwen2_5_0_5b_gpu.sh` (the GPU example, 512 + 512 tokens, ignore_eos,
KL loss, so a reference policy is computed); the first step (warm-up) is left out of the medians. One
`benchmarks.harness` result goes to `benchmarks/results/<date>_<gpu>/lora_<arch>.json` (or `--out`), rewritten
after each mode: a `<mode>_<phase>_s` timing metric per mode and phase, the runs under `runs`
(docs/benchmarks/lora.md).
"""

from __future__ import annotations

import argparse
import json
import os
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
PHASES = ("timing_s/step", "timing_s/gen", "timing_s/old_log_prob", "timing_s/ref", "timing_s/update_actor",
          "timing_s/update_weights")


def run_mode(mode: str, args: argparse.Namespace, model: Path, data: Path, out: Path) -> dict:
    lora = [] if mode == "full" else [f"actor_rollout_ref.model.lora_rank={args.rank}",
                                      f"actor_rollout_ref.model.lora_alpha={2 * args.rank}",
                                      "actor_rollout_ref.actor.optim.lr=1e-5"]
    run_dir = Path(f"/tmp/run_lora_{args.arch}_{mode}")
    shutil.rmtree(run_dir, ignore_errors=True)  # metrics.jsonl is appended to: start each run empty
    cmd = ["bash", "examples/grpo_trainer/run_qwen2_5_0_5b_gpu.sh",
           f"data.train_batch_size={args.prompts}", "data.max_response_length=512", "data.val_files=null",
           f"actor_rollout_ref.actor.ppo_mini_batch_size={args.prompts}",
           f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={args.micro}",
           f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={args.micro}",
           f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={args.micro}",
           f"actor_rollout_ref.rollout.gpu_memory_utilization={args.gpu_memory_utilization}",
           "actor_rollout_ref.rollout.ignore_eos=true", f"trainer.total_training_steps={args.steps}",
           "trainer.test_freq=-1", "trainer.save_freq=-1", "trainer.val_before_train=false",
           f"trainer.experiment_name=lora_{mode}", f"trainer.default_local_dir={run_dir}", *lora, *MODES[mode]]
    env = {"MODEL_PATH": str(model), "DATA_DIR": str(data), "N_GPUS": "1"}
    start = time.perf_counter()
    log = out.with_suffix(f".{mode}.log")
    with open(log, "w") as f:
        proc = subprocess.run(cmd, cwd=REPO, env={**os.environ, **env}, stdout=f, stderr=subprocess.STDOUT,
                              timeout=args.timeout)
    result: dict = {"mode": mode, "rc": proc.returncode, "wall_s": round(time.perf_counter() - start, 1)}
    metrics = run_dir / "metrics.jsonl"
    if proc.returncode != 0 or not metrics.exists():
        result["log_tail"] = log.read_text()[-3000:]
        return result
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    steps = [r for r in rows if "timing_s/step" in r][1:]  # step 1 warms up (CUDA graphs, allocator)
    result["steps_measured"] = len(steps)
    for key in PHASES:
        vals = [r[key] for r in steps if key in r]
        if vals:
            result[key] = {**harness.spread(vals), "all": vals}
    for key in ("perf/max_memory_allocated_gb", "perf/max_memory_reserved_gb"):
        result[key] = round(max(r.get(key, 0.0) for r in rows), 2)
    return result


def build_result(args: argparse.Namespace, runs: list[dict[str, Any]], env: dict[str, Any] | None = None
                 ) -> harness.Result:
    """The harness result of the finished `runs` (from `run_mode`): one timing metric per mode and phase."""
    res = harness.Result(f"lora_{args.arch}", harness.command_line(), args.steps, env=env or harness.environment())
    for run in runs:
        for key in PHASES:
            if key in run:
                res.timing(f"{run['mode']}_{key.removeprefix('timing_s/')}_s", run[key]["all"])
    res.extra.update(args=harness.params(args), arch=args.arch, rank=args.rank, prompts=args.prompts, n=8,
                     prompt_len=512, response_len=512, runs=runs)
    return res


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", choices=["0.5b", "7b"], default="0.5b")
    ap.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES))
    ap.add_argument("--rank", type=int, default=32)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--micro", type=int, default=32)
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    ap.add_argument("--timeout", type=int, default=900)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    import torch
    from bench_limits import build_model

    model = Path(f"/tmp/model_{args.arch}")
    if not (model / "config.json").exists():
        start = time.perf_counter()
        build_model(model, arch=args.arch)
        print(f"[lora] built {args.arch} model in {time.perf_counter() - start:.0f} s", flush=True)
        torch.cuda.empty_cache()
    data = Path("/tmp/d")
    if not (data / "train.parquet").exists():
        subprocess.run([sys.executable, "examples/data_preprocess/times_ten.py", "--local_dir", str(data)],
                       cwd=REPO, check=True, capture_output=True)
    env = harness.environment()
    out = args.out or harness.session_dir(harness.RESULTS, env) / f"lora_{args.arch}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    runs: list[dict[str, Any]] = []
    for mode in args.modes:
        runs.append(run_mode(mode, args, model, data, out))
        print(json.dumps(runs[-1]), flush=True)
        build_result(args, runs, env).write(path=out)  # each finished mode, even if a later one runs out of time
    print(f"[lora] wrote {out}")


if __name__ == "__main__":
    main()
