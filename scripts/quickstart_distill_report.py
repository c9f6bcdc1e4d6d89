"""The closing lines and the plot of `TASK=distill bash scripts/quickstart.sh`, from the runs' `metrics.jsonl`.

    python scripts/quickstart_distill_report.py --teacher RUN --distill RUN --grpo RUN [--plot out.png]
        [--metric val-core/rlpost/arith/reward/mean@1] [--fraction 0.8]

Prints
    teacher: 1.00
    student after distillation: 0.95 (step 4)
    student after GRPO alone: 0.90 (step 10)
where each student line is the first validated step at which the student reached `fraction` x the teacher's
held-out accuracy (its last validation, and the run's last step, when it never did). The plot has both students'
held-out curves and the teacher's level. Exits with status 1 when a run holds no validation of the metric.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rlpost.utils.plot import load_metrics, series

DEFAULT_METRIC = "val-core/rlpost/arith/reward/mean@1"


def curve(run: str | Path, metric: str = DEFAULT_METRIC) -> tuple[list[int], list[float]]:
    """(steps, values) of the run's validations of `metric`; ValueError when there is none."""
    steps, values = series(load_metrics(run), metric)
    if not steps:
        raise ValueError(f"{run}: no validation of {metric!r} in its metrics.jsonl")
    return steps, values


def reached(steps: list[int], values: list[float], target: float) -> tuple[float, int, bool]:
    """(value, step, True) at the first validation >= target; (last value, last step, False) if none is."""
    for step, value in zip(steps, values):
        if value >= target:
            return value, step, True
    return values[-1], steps[-1], False


def student_line(what: str, steps: list[int], values: list[float], target: float) -> str:
    value, step, ok = reached(steps, values, target)
    return f"student after {what}: {value:.2f} (step {step})" + ("" if ok else f", below {target:.2f}")


def plot(curves: dict[str, tuple[list[int], list[float]]], teacher: float, out: str | Path) -> Path:
    """Both students' held-out accuracy per step and the teacher's level, into the PNG `out`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for label, (steps, values) in curves.items():
        ax.plot(steps, values, marker="o", markersize=4, label=label)
    ax.axhline(teacher, color="gray", linestyle="--", label=f"teacher ({teacher:.2f})")
    ax.set(title="Held-out accuracy (greedy) of the student", xlabel="RL step", ylabel="accuracy", ylim=(-0.02, 1.05))
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--teacher", required=True, help="the teacher's val_only run folder")
    parser.add_argument("--distill", required=True, help="the distillation run folder")
    parser.add_argument("--grpo", required=True, help="the GRPO-alone run folder")
    parser.add_argument("--plot", default=None, help="PNG to write (none when not given)")
    parser.add_argument("--metric", default=DEFAULT_METRIC)
    parser.add_argument("--fraction", type=float, default=0.8, help="of the teacher's accuracy, the target")
    args = parser.parse_args(argv)
    try:
        teacher = curve(args.teacher, args.metric)[1][-1]
        runs = {"distillation": curve(args.distill, args.metric), "GRPO alone": curve(args.grpo, args.metric)}
    except (OSError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    if args.plot:
        print(f"plot: {plot(runs, teacher, args.plot)}")
    target = args.fraction * teacher
    print(f"teacher: {teacher:.2f}")
    for what, (steps, values) in runs.items():
        print(student_line(what, steps, values, target))
    return 0


if __name__ == "__main__":
    sys.exit(main())
