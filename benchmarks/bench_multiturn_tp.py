"""Goal T1 (issue 49): multi-turn agent loops with rollout tensor parallelism 2, with vLLM and SGLang.

    python3 -m benchmarks.bench_multiturn_tp --device cuda --engines vllm sglang --out-dir $SESSION   # 2 GPUs
    python3 -m benchmarks.bench_multiturn_tp --device cpu --engines vllm --steps 1 --out-dir /tmp/t1    # CPU, gloo

For each engine, two parts, each in its own processes:
1. `check`: `scripts/check_multiturn_tp.py` at TP 2 (torchrun, 2 ranks sharing one engine; the first rank runs
   every agent loop, vLLM's peer replays its engine calls, SGLang's engine runs the TP schedulers), then TP 1 on
   the same rows: greedy agent loops with the calculator tool. Reported: rows, rows identical, trajectories with a
   tool turn, each side's generation time. On a GPU the TP-2 sums are ordered differently from TP 1, so a greedy
   path may leave a near-tie the other way; identical rows are a diagnostic there, not the goal.
2. `main_ppo`: `examples/multiturn/run_gsm8k_multiturn_tp2.sh` (verl's TP-2 multi-turn GSM8K script, downscaled)
   at TP 2 for `--steps` steps: the steps completed, their times, the turns per trajectory and the tool calls.

The tiny calculator model and its data come from `examples/multiturn/run_tiny_cpu.sh` (PREPARE_ONLY=1: data, a
tiny Qwen2 model, SFT until it calls the tool), built once under `--work-dir`. Writes `<out-dir>/multiturn_tp.json`
(`benchmarks.harness` schema): per engine `<engine>_steps_done`, `<engine>_step_s`, `<engine>_rows_identical`,
and under `engines` every part's exit status, log and figures (a later run adds its engines to the file).
`benchmarks.goals_49` reads it: T1 is met when the `main_ppo` runs of both engines completed all their steps.
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

from benchmarks import harness  # noqa: E402
from benchmarks.main_ppo_runs import launch  # noqa: E402

CHECK = REPO / "scripts" / "check_multiturn_tp.py"
EXAMPLE = REPO / "examples" / "multiturn" / "run_gsm8k_multiturn_tp2.sh"
PREPARE = REPO / "examples" / "multiturn" / "run_tiny_cpu.sh"
RESULT = "multiturn_tp.json"


def prepare(work_dir: Path, sft_steps: int) -> tuple[Path, Path]:
    """(model folder, data folder) of the tiny calculator task, built by run_tiny_cpu.sh when missing."""
    env = {**os.environ, "WORK_DIR": str(work_dir), "SFT_STEPS": str(sft_steps), "PREPARE_ONLY": "1"}
    subprocess.run(["bash", str(PREPARE)], cwd=REPO, env=env, check=True)
    return work_dir / "sft" / f"global_step_{sft_steps}", work_dir / "data"


def check_commands(engine: str, device: str, model: Path, data: Path, out: Path, rows: int) -> list[list[str]]:
    """The TP-2 run (torchrun, 2 ranks) then the TP-1 run that compares (check_multiturn_tp.py's two halves)."""
    args = [str(CHECK), "--model", str(model), "--data", str(data / "test.parquet"), "--out", str(out),
            "--rows", str(rows), "--engine", engine, "--device", device]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    return [torchrun + args, [sys.executable, *args]]


def main_ppo_command(engine: str, device: str, steps: int, run_dir: Path) -> tuple[list[str], dict[str, str]]:
    """The example script at TP 2 on `engine`, with its metrics into run_dir/metrics.jsonl (the file logger)."""
    cmd = ["bash", str(EXAMPLE), f"trainer.total_training_steps={steps}", "trainer.logger=[console,file]",
           f"trainer.default_local_dir={run_dir}"]
    env = {"DEVICE": "gpu" if device == "cuda" else "cpu", "ENGINE": engine, "TP": "2"}
    return cmd, env


def run_check(engine: str, args: argparse.Namespace, model: Path, data: Path) -> dict[str, Any]:
    out = args.out_dir / f"t1_check_{engine}"
    shutil.rmtree(out, ignore_errors=True)
    log = args.out_dir / f"t1_check_{engine}.log"
    entry: dict[str, Any] = {"log": log.name}
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    with log.open("w") as fh:
        for name, cmd in zip(("tp2", "tp1"), check_commands(engine, args.device, model, data, out, args.rows)):
            start = time.monotonic()
            try:
                rc = subprocess.run(cmd, cwd=REPO, env=env, stdout=fh, stderr=subprocess.STDOUT,
                                    timeout=args.part_timeout).returncode
            except subprocess.TimeoutExpired:
                rc = "timeout"
            entry[f"{name}_rc"], entry[f"{name}_wall_s"] = rc, round(time.monotonic() - start, 1)
            if name == "tp2" and rc != 0:
                return entry
    compare = out / "compare.json"
    if compare.is_file():
        entry.update(json.loads(compare.read_text()))
    return entry


def run_main_ppo(engine: str, args: argparse.Namespace) -> dict[str, Any]:
    run_dir = Path(f"/tmp/t1_main_ppo_{engine}")
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    cmd, env = main_ppo_command(engine, args.device, args.steps, run_dir)
    env.update(WORK_DIR=str(args.work_dir), SFT_STEPS=str(args.sft_steps))
    log = args.out_dir / f"t1_main_ppo_{engine}.log"
    got = launch(cmd, env, run_dir, log, f"t1 {engine}", timeout_s=args.part_timeout)
    (args.out_dir / f"t1_main_ppo_{engine}_metrics.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in got.rows))
    steps = [r["timing_s/step"] for r in got.rows if "timing_s/step" in r]
    turns = [r["multi_turn/num_turns/mean"] for r in got.rows if "multi_turn/num_turns/mean" in r]
    return {"rc": got.rc, "timed_out": got.timed_out, "wall_s": round(got.wall_s, 1), "steps_asked": args.steps,
            "steps_done": len(got.rows), "step_s": steps, "turns_mean": turns, "log": log.name,
            "tool_calls": [r.get("multi_turn/tool_calls/mean") for r in got.rows]}


def summarize(engines: dict[str, dict[str, Any]], command: str) -> harness.Result:
    """The result file from each engine's parts (what ran, what came of it)."""
    res = harness.Result("multiturn_tp", command, 0)
    for engine, parts in engines.items():
        run, check = parts.get("main_ppo", {}), parts.get("check", {})
        res.metric(f"{engine}_steps_done", run.get("steps_done"), unit="steps", asked=run.get("steps_asked"))
        if run.get("step_s"):
            res.timing(f"{engine}_step_s", run["step_s"])
        if "rows" in check:
            res.metric(f"{engine}_rows_identical", check["rows_identical"], unit="rows", rows=check["rows"],
                       tool_turn_rows=check.get("tool_turn_rows"))
    res.reps = min((p.get("main_ppo", {}).get("steps_done") or 0 for p in engines.values()), default=0)
    res.extra["engines"] = engines
    return res


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engines", nargs="+", default=["vllm", "sglang"], choices=["vllm", "sglang"])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--steps", type=int, default=2, help="main_ppo steps per engine")
    ap.add_argument("--rows", type=int, default=8, help="prompts of the TP-2 / TP-1 check (even)")
    ap.add_argument("--parts", nargs="+", default=["check", "main_ppo"], choices=["check", "main_ppo"])
    ap.add_argument("--work-dir", type=Path, default=Path("/tmp/rlpost_multiturn"),
                    help="the tiny model and data (built there when missing)")
    ap.add_argument("--sft-steps", type=int, default=60)
    ap.add_argument("--part-timeout", type=int, default=240, help="seconds per run before it is killed")
    ap.add_argument("--out-dir", type=Path, required=True)
    args = ap.parse_args(argv)
    if args.rows % 2:
        ap.error(f"--rows={args.rows}: must be even (half per rank at TP 2), e.g. --rows={args.rows + 1}")
    return args


def main(argv: list[str] | None = None) -> Path:
    args = parse_args(argv)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    model, data = prepare(args.work_dir, args.sft_steps)
    path = args.out_dir / RESULT
    # one engine per device call (gpu_session_b.sh's t1v, t1s): the file keeps the engines run before
    engines: dict[str, dict[str, Any]] = json.loads(path.read_text()).get("engines", {}) if path.is_file() else {}
    for engine in args.engines:
        engines[engine] = {}
        if "check" in args.parts:
            engines[engine]["check"] = run_check(engine, args, model, data)
            print(f"[t1] {engine} check: {json.dumps(engines[engine]['check'])}", flush=True)
        if "main_ppo" in args.parts:
            engines[engine]["main_ppo"] = run_main_ppo(engine, args)
            print(f"[t1] {engine} main_ppo: {json.dumps(engines[engine]['main_ppo'])}", flush=True)
        summarize(engines, harness.command_line()).write(path=path)  # after each engine: a cut run keeps its parts
    print(f"[t1] -> {path}")
    return path


if __name__ == "__main__":
    main()
