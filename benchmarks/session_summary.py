"""A GPU session's `summary.json` with every goal id of one issue's goal set, then INDEX.md and the current page.

    python -m benchmarks.session_summary benchmarks/results/<date>_h200 [--reason ID=TEXT ...]
    python -m benchmarks.session_summary benchmarks/results/<date>_h200x4 --goals 49   # the four-GPU issue

Goals a result file of the folder measured come from that file (`harness.write_summary`); every other id of the
set is written as not measured, with the reason from `--reason` or the set's reasons. Set 48 (the default) is
`GOALS` below, the one-GPU efficiency issue; set 49 is `benchmarks.goals_49.GOALS`, whose values
`goals_49.derive` first works out from the session's files into `goals_49.json`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from benchmarks import current_numbers, goals_49, harness

# Goal id -> target: the GPU efficiency goals (one H200, 0.5B architecture, 64 prompts x 8, GSM8K-shaped work).
GOALS = {
    "A1": ">= 0.30",                     # actor update MFU (6·N·tokens / time / 989 TFLOP/s)
    "A1_limit": ">= 0.95",               # the update against the strong bare loop (bare / rlpost)
    "A2": ">= 0.35",                     # old_log_prob MFU (2·N·tokens)
    "A3": ">= 0.95, ci_low >= 0.90",     # generation in the loop against bare vLLM
    "A4": ">= 1.5",                      # generation tokens/s against today's, per GPU
    "C1": ">= 1.00",                     # remove-padding against padded, fixed lengths
    "C2": ">= 1.3",                      # remove-padding against padded per step, realistic lengths
    "C3": "<= 0.5",                      # rlpost step time against verl's at its recommended settings
    "E1": ">= 0.90",                     # PPO critic: values against the bare value-head loop (bare / rlpost)
    "E1_update": ">= 0.95",              # PPO critic: update_critic against the bare value-head loop
    "E2": "<= 1.15",                     # 7B-architecture LoRA step against the sum of its LoRA limits
}
REASONS = {
    "A4": "benchmarks/bench_gen_knobs.py did not finish in this session (each engine's start, with vLLM's "
          "compilation and autotuning, takes ~70 s on an H200: give gpu_session_g.sh LIMIT_GEN >= 300); "
          "realistic.json holds today's generation tokens/s on this workload (rlpost_gen_tokens_per_s) as its "
          "baseline",
    "C3": "verl 0.9.1 was not run in this session: bash benchmarks/gpu_session_c3.sh runs both sides on the same "
          "parquet (ignore_eos and per-sample caps on both; verl padded with dynamic batch size, its packing needs "
          "flash-attn) and writes verl_c3.json",
    "E1": "benchmarks/bench_critic.py did not run in this session",
    "E1_update": "benchmarks/bench_critic.py did not run in this session",
    "E2": "benchmarks/bench_lora.py --arch 7b --limits did not run in this session",
}

# Issue -> (goal id -> target, goal id -> reason when not measured).
GOAL_SETS = {"48": (GOALS, REASONS), "49": (goals_49.GOALS, goals_49.NOT_BUILT)}


def main(argv: list[str] | None = None) -> Path:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--reason", nargs="*", default=[], metavar="ID=TEXT")
    ap.add_argument("--results", type=Path, default=harness.RESULTS, help="root for INDEX.md and the page")
    ap.add_argument("--page", type=Path, default=current_numbers.OUT)
    ap.add_argument("--goals", choices=sorted(GOAL_SETS), default="48", help="the issue whose goal ids to file")
    args = ap.parse_args(argv)
    goals, reasons = GOAL_SETS[args.goals]
    given = {}
    for item in args.reason:
        gid, _, text = item.partition("=")
        if gid not in goals or not text:
            ap.error(f"--reason {item!r}: give ID=TEXT with ID one of {', '.join(goals)}")
        given[gid] = text
    reasons = {**reasons, **given}
    if args.goals == "49":  # every id is in goals_49.json: a given reason replaces a not-measured goal's own
        derived = goals_49.derive(args.folder)
        for gid, text in given.items():
            if derived.goals[gid]["value"] is None:
                derived.goals[gid]["reason"] = text
        derived.write(path=args.folder / "goals_49.json")
    path = harness.write_summary(args.folder, goals, reasons)
    if args.folder.resolve().parent == args.results.resolve():
        harness.write_index(args.results)
        current_numbers.main(["--results", str(args.results), "--out", str(args.page)])
    print(f"[session_summary] wrote {path}")
    return path


if __name__ == "__main__":
    main()
