"""The curves of benchmarks/gpu_learn.sh's run: SFT loss, then GRPO's sampled score, tool-call share and greedy
held-out accuracy per step; an earlier run (another SFT length and learning rate) beside it.

    python -m benchmarks.plot_gpu_learn benchmarks/results/2026-12-03_h200/learn --out docs/images/gpu_learn.png
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rlpost.utils.plot import load_metrics, series

VAL = "val-core/rlpost/arith/reward/mean@1"


def plot(folder: Path, out: Path, runs: dict[str, str]) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_sft, ax_rl) = plt.subplots(1, 2, figsize=(11, 4))
    ax_sft.plot(*series(load_metrics(folder / "sft_metrics.jsonl"), "train/loss"), lw=0.8)
    ax_sft.set(title="SFT from random weights (64 transcripts / step)", xlabel="SFT step", ylabel="loss")
    for (label, name), colour in zip(runs.items(), ("tab:blue", "tab:red", "tab:green")):
        recs = load_metrics(folder / name)
        ax_rl.plot(*series(recs, VAL), "o-", color=colour, label=f"held-out accuracy (greedy), {label}")
        ax_rl.plot(*series(recs, "critic/score/mean"), "--", color=colour, alpha=0.6,
                   label=f"sampled score, {label}")
    ax_rl.set(title="GRPO + tool_agent, 64 prompts x 8", xlabel="GRPO step", ylim=(-0.05, 1.05))
    ax_rl.legend(fontsize=7, loc="center right")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    return out


def main(argv: list[str] | None = None) -> Path:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    out = plot(args.folder, args.out, {"lr 1e-5, SFT 300 steps": "grpo_metrics.jsonl",
                                       "lr 3e-5, SFT 400 steps": "grpo_metrics_lr3e-5_collapsed.jsonl"})
    print(f"[plot_gpu_learn] wrote {out}")
    return out


if __name__ == "__main__":
    main()
