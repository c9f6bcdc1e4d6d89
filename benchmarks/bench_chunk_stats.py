"""The per-chunk log-prob + entropy maths of old_log_prob (`rlpost.engine.fused_logprob.chunk_stats`) against the
softmax formula it replaced, alternated, on one (rows x vocab) float32 chunk.

    python3 benchmarks/bench_chunk_stats.py --device cuda --rows 4096 --vocab 151936 --reps 7

Variants: `softmax_formula` (lse - sum(softmax(z) * z), before 2026-11-27), `chunk_stats` (with entropy, now),
`no_entropy` (logsumexp + gather only: what ref pays). Each repetition runs every variant once, in turn; medians,
ranges and the largest entropy difference go to one `benchmarks.harness` result,
`benchmarks/results/<date>_<gpu|cpu>/chunk_stats.json` (or `--json-out`): a `<variant>_s` timing metric each
(median, spread, every repetition), the per-variant summaries under `variants`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks import harness  # noqa: E402
from rlpost.engine.fused_logprob import chunk_stats  # noqa: E402

VARIANTS = ("softmax_formula", "chunk_stats", "no_entropy")


def softmax_formula(z: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The formula `chunk_stats` used before: logsumexp, then softmax and its product with z."""
    lse = torch.logsumexp(z, dim=-1)
    logp = z.gather(-1, labels[:, None]).squeeze(-1) - lse
    return lse, logp, lse - (torch.softmax(z, dim=-1) * z).sum(-1)


def measure(rows: int, vocab: int, reps: int, device: torch.device) -> dict[str, Any]:
    g = torch.Generator(device=device).manual_seed(0)
    z = torch.randn(rows, vocab, generator=g, device=device) * 3
    labels = torch.randint(0, vocab, (rows,), generator=g, device=device)
    variants = {
        "softmax_formula": lambda: softmax_formula(z, labels),
        "chunk_stats": lambda: chunk_stats(z, labels, True),
        "no_entropy": lambda: chunk_stats(z, labels, False),
    }
    for fn in variants.values():  # warm-up
        fn()
    sync = torch.cuda.synchronize if device.type == "cuda" else None
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(reps):
        for name, fn in variants.items():
            times[name].append(harness.timed(fn, sync)[0])
    diff = (softmax_formula(z, labels)[2] - chunk_stats(z, labels, True)[2]).abs().max().item()
    return {name: {"median_s": statistics.median(t), "min_s": min(t), "max_s": max(t), "all_s": t}
            for name, t in times.items()} | {"max_entropy_diff": diff}


def build_result(args: Any, measured: dict[str, Any], env: dict[str, Any] | None = None) -> harness.Result:
    """The harness result of `measure`'s output: one timing metric per variant, the summaries kept."""
    res = harness.Result("chunk_stats", harness.command_line(), args.reps, env=env or harness.environment())
    for name in VARIANTS:
        res.timing(f"{name}_s", measured[name]["all_s"])
    res.metric("max_entropy_diff", measured["max_entropy_diff"], unit="nats")
    res.extra.update(args=harness.params(args), variants=measured)
    return res


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--rows", type=int, default=4096, help="tokens per chunk (the actor's chunk is 4096)")
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--json-out", type=Path, default=None)
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    measured = measure(args.rows, args.vocab, args.reps, device)
    for name in VARIANTS:
        r = measured[name]
        print(f"{name:16s} {r['median_s'] * 1e3:8.2f} ms [{r['min_s'] * 1e3:.2f}, {r['max_s'] * 1e3:.2f}]")
    print(f"wrote {build_result(args, measured).write(path=args.json_out)}")
    return measured


if __name__ == "__main__":
    main()
