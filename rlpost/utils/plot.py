"""PNG plots of a run's main curves from `metrics.jsonl` (written by the `file` logger).

    python -m rlpost.utils.plot checkpoints/<project>/<experiment> [--out_dir plots/]
    python -m rlpost.utils.plot path/to/metrics.jsonl

Writes, for the metrics present: score.png, loss.png, kl.png, entropy.png, response_length.png,
timing.png (per-phase `timing_s/*` stacked, `timing_s/step` as a line), val_core.png (`val-core/*`).
Default output folder: `<run_dir>/plots`. When a step appears more than once (a resumed run appends to
the same file), its last line wins. "nan"/"inf" strings (how the file logger writes non-finite values)
become floats again. matplotlib (Agg backend, no display needed) is imported only here.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Sequence

from rlpost.utils.tracking import METRICS_FILE

# (file stem, title, metric names); missing names are skipped, a figure with none is not written.
LINE_PLOTS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("score", "Score / reward", ("critic/score/mean", "critic/rewards/mean", "critic/score/max", "critic/score/min")),
    ("loss", "Losses", ("actor/pg_loss", "critic/vf_loss")),
    ("kl", "KL", ("actor/ppo_kl", "actor/kl_loss", "critic/kl", "actor/kl_coef")),
    ("entropy", "Entropy", ("actor/entropy",)),
    ("response_length", "Response length", ("response_length/mean", "response_length/max", "response_length/min")),
)
TIMING_PREFIX = "timing_s/"
VAL_CORE_PREFIX = "val-core/"


def _num(value: Any) -> float | None:
    """A float for numbers and "nan"/"inf"/"-inf" strings; None for anything else."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str) and value in ("nan", "inf", "-inf"):
        return float(value)
    return None


def load_metrics(path: str | Path) -> list[dict[str, Any]]:
    """Records of a metrics.jsonl (or of `<run_dir>/metrics.jsonl`), one per step, sorted by step."""
    path = Path(path)
    if path.is_dir():
        path = path / METRICS_FILE
    by_step: dict[int, dict[str, Any]] = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                record = json.loads(line)
            except ValueError:  # a line cut short by a crash
                continue
            if "step" in record:
                by_step[int(record["step"])] = record
    return [by_step[s] for s in sorted(by_step)]


def series(records: Sequence[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of `key` over the records that have a numeric value for it."""
    steps, values = [], []
    for record in records:
        value = _num(record.get(key))
        if value is not None:
            steps.append(int(record["step"]))
            values.append(value)
    return steps, values


def _keys_with_prefix(records: Sequence[dict[str, Any]], prefix: str) -> list[str]:
    return sorted({k for r in records for k in r if k.startswith(prefix) and _num(r[k]) is not None})


def _line_figure(records: Sequence[dict[str, Any]], title: str, keys: Sequence[str], out: Path) -> Path | None:
    """One axes with a line per key; None (nothing written) when no key has data."""
    import matplotlib.pyplot as plt

    curves = [(k, *series(records, k)) for k in keys]
    curves = [c for c in curves if c[1]]
    if not curves:
        return None
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for key, steps, values in curves:
        ax.plot(steps, values, marker="o" if len(steps) < 30 else None, markersize=3, label=key)
    ax.set(title=title, xlabel="step")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


# timed inside another phase (the rollout worker's own parts of gen): not stacked
NESTED_PHASES = ("gen_wake", "gen_engine", "gen_sleep")


def _timing_figure(records: Sequence[dict[str, Any]], out: Path) -> Path | None:
    """Per-phase seconds stacked per step, plus the whole step time as a line."""
    import matplotlib.pyplot as plt

    phases = [k for k in _keys_with_prefix(records, TIMING_PREFIX)
              if k[len(TIMING_PREFIX):] not in ("step", *NESTED_PHASES)]
    step_steps, step_values = series(records, TIMING_PREFIX + "step")
    if not phases and not step_steps:
        return None
    fig, ax = plt.subplots(figsize=(8, 4.5))
    if phases:
        steps = [int(r["step"]) for r in records]
        stacks = [[_num(r.get(k)) or 0.0 for r in records] for k in phases]
        ax.stackplot(steps, stacks, labels=[k[len(TIMING_PREFIX):] for k in phases], alpha=0.8)
    if step_steps:
        ax.plot(step_steps, step_values, color="black", linewidth=1.5, label="step (total)")
    ax.set(title="Time per step by phase (s)", xlabel="step", ylabel="seconds")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def plot_run(path: str | Path, out_dir: str | Path | None = None) -> list[Path]:
    """Write the PNGs for the run at `path` (run folder or metrics.jsonl); return the files written."""
    import matplotlib

    matplotlib.use("Agg")
    path = Path(path)
    records = load_metrics(path)
    if not records:
        raise ValueError(f"{path}: no metric records")
    out = Path(out_dir) if out_dir is not None else (path if path.is_dir() else path.parent) / "plots"
    out.mkdir(parents=True, exist_ok=True)
    written = [_line_figure(records, title, keys, out / f"{stem}.png") for stem, title, keys in LINE_PLOTS]
    written.append(_timing_figure(records, out / "timing.png"))
    val_keys = _keys_with_prefix(records, VAL_CORE_PREFIX)
    written.append(_line_figure(records, "Validation (val-core)", val_keys, out / "val_core.png"))
    return [p for p in written if p is not None]


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry: prints the written files; exit code 0."""
    parser = argparse.ArgumentParser(prog="python -m rlpost.utils.plot", description="Plot a run's metrics.jsonl.")
    parser.add_argument("path", help="run folder (trainer.default_local_dir) or a metrics.jsonl file")
    parser.add_argument("--out_dir", default=None, help="output folder (default: <run_dir>/plots)")
    args = parser.parse_args(argv)
    for file in plot_run(args.path, args.out_dir):
        print(file)
    return 0


if __name__ == "__main__":
    sys.exit(main())
