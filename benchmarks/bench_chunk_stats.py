"""The per-chunk log-prob + entropy maths of old_log_prob (`rlpost.engine.fused_logprob.chunk_stats`) against the
softmax formula it replaced, alternated, on one (rows x vocab) float32 chunk.

    python3 benchmarks/bench_chunk_stats.py --device cuda --rows 4096 --vocab 151936 --reps 7

Variants: `softmax_formula` (lse - sum(softmax(z) * z), before 2026-11-27), `chunk_stats` (with entropy, now),
`no_entropy` (logsumexp + gather only: what ref pays). Each repetition runs every variant once, in turn; medians,
ranges and the largest entropy difference go to `benchmarks/results/chunk_stats_<device>.json` (or `--json-out`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rlpost.engine.fused_logprob import chunk_stats  # noqa: E402


def softmax_formula(z: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The formula `chunk_stats` used before: logsumexp, then softmax and its product with z."""
    lse = torch.logsumexp(z, dim=-1)
    logp = z.gather(-1, labels[:, None]).squeeze(-1) - lse
    return lse, logp, lse - (torch.softmax(z, dim=-1) * z).sum(-1)


def timed(fn: Callable[[], Any], device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


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
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(reps):
        for name, fn in variants.items():
            times[name].append(timed(fn, device))
    diff = (softmax_formula(z, labels)[2] - chunk_stats(z, labels, True)[2]).abs().max().item()
    return {name: {"median_s": statistics.median(t), "min_s": min(t), "max_s": max(t), "all_s": t}
            for name, t in times.items()} | {"max_entropy_diff": diff}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--rows", type=int, default=4096, help="tokens per chunk (the actor's chunk is 4096)")
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--json-out", type=Path, default=None)
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    res = {"args": {k: str(v) for k, v in vars(args).items()},
           "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
           "torch": torch.__version__, **measure(args.rows, args.vocab, args.reps, device)}
    for name in ("softmax_formula", "chunk_stats", "no_entropy"):
        r = res[name]
        print(f"{name:16s} {r['median_s'] * 1e3:8.2f} ms [{r['min_s'] * 1e3:.2f}, {r['max_s'] * 1e3:.2f}]")
    slug = "".join(c if c.isalnum() else "_" for c in res["device"].replace("NVIDIA ", "")).strip("_").lower()
    out = args.json_out or REPO / "benchmarks" / "results" / f"chunk_stats_{slug}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1))
    print(f"wrote {out}")
    return res


if __name__ == "__main__":
    main()
