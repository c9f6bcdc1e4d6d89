"""Held-out accuracy before and after RL, read from a run's `metrics.jsonl` (the trainer's `file` logger).

    python scripts/quickstart_eval.py /abs/run_dir [--metric val-core/rlpost/arith/reward/mean@1] [--label TEXT]
        [--tool_calls] [--blank_metric val-core/rlpost/colour_blank/reward/mean@1]

The trainer validates greedily on the held-out split before the first step (`trainer.val_before_train`)
and after the last one; this prints, as the last line,
    held-out accuracy: before=0.31 after=0.62
With --tool_calls (multi-turn runs) it then also prints the share of held-out trajectories with a tool call:
    tool-call rate: before=0.05 after=0.97
With --blank_metric (the vision task's control: the held-out rows with blank pictures) it prints last
    images blanked: after=0.25
Exits with status 1 when the file holds fewer than two validations of the metric.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

DEFAULT_METRIC = "val-core/rlpost/arith/reward/mean@1"
TOOL_CALL_METRIC = "val-aux/multi_turn/tool_call_frac"


def read_validations(path: str | Path, metric: str = DEFAULT_METRIC) -> list[tuple[int, float]]:
    """(step, value) of every record of `path` (a run folder or a metrics.jsonl) that holds `metric`."""
    path = Path(path)
    if path.is_dir():
        path = path / "metrics.jsonl"
    found = []
    for line in path.read_text().splitlines():
        if line.strip():
            record = json.loads(line)
            if metric in record:
                found.append((int(record["step"]), float(record[metric])))
    return sorted(found)


def before_after(path: str | Path, metric: str = DEFAULT_METRIC) -> tuple[float, float]:
    """The metric at the first and at the last validated step; ValueError when there are fewer than two."""
    found = read_validations(path, metric)
    if len(found) < 2:
        raise ValueError(f"{path}: need validations before and after training of {metric!r}, found {found}")
    return found[0][1], found[-1][1]


def summary_line(before: float, after: float, what: str = "held-out accuracy") -> str:
    """The quickstart's closing line."""
    return f"{what}: before={before:.2f} after={after:.2f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", help="trainer.default_local_dir of the run, or its metrics.jsonl")
    parser.add_argument("--metric", default=DEFAULT_METRIC)
    parser.add_argument("--label", default="held-out accuracy", help="what the closing line calls the metric")
    parser.add_argument("--tool_calls", action="store_true", help=f"also print the tool-call rate ({TOOL_CALL_METRIC})")
    parser.add_argument("--blank_metric", default=None, help="also print this metric after training, as the "
                        "accuracy with the images blanked")
    args = parser.parse_args(argv)
    wanted = [(args.metric, args.label)] + ([(TOOL_CALL_METRIC, "tool-call rate")] if args.tool_calls else [])
    try:
        lines = [summary_line(*before_after(args.run, metric), what) for metric, what in wanted]
        if args.blank_metric:
            lines.append(f"images blanked: after={before_after(args.run, args.blank_metric)[1]:.2f}")
    except (OSError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
