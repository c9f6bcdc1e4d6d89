"""Packed attention with grouped-query k/v: G heads straight into the varlen kernel vs k/v repeated to H heads.

    python benchmarks/bench_varlen_gqa.py                  # GPU: Qwen2.5-0.5B heads, 64 x 8 rows' packed micro-batch
    python benchmarks/bench_varlen_gqa.py --device cpu --seq-lens 12 9 --reps 2    # CPU smoke test

Both sides run `rlpost.engine.packed_attention.attend_packed` on the same (H, N, D) queries; the "repeat" side
hands it k/v already repeated H / G times (what it did itself before it passed G-head k/v to the kernel), inside
autograd, so its backward also sums the repeated gradients. Forward and forward + backward are timed with CUDA
events (wall clock on the CPU), alternating the sides round by round; the outputs and gradients of the two sides
are compared first. Writes one `benchmarks.harness` result, `benchmarks/results/<date>_<gpu|cpu>/varlen_gqa.json`
(or --json-out): a `<side>_<phase>_ms` timing metric each (median, spread, every call), the per-side summaries,
speed-ups and differences beside them. Needs only torch.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Callable

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.append(str(REPO))  # after PYTHONPATH: a snapshot of rlpost put there wins
sys.path.append(str(REPO / "benchmarks"))

from benchmarks import harness  # noqa: E402
from rlpost.engine.packed_attention import attend_packed, packed_sequences, varlen_available  # noqa: E402

SIDES = ("repeat", "native")


def timed(fn: Callable[[], Any], reps: int, cuda: bool, warmup: int = 3) -> list[float]:
    """Milliseconds of each of `reps` calls of `fn` after `warmup` untimed ones (CUDA events when `cuda`: the
    kernels' own time, without the host's launch overhead; `harness.timed` on the CPU)."""
    out = []
    for i in range(warmup + reps):
        if cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            torch.cuda.synchronize()
            ms = a.elapsed_time(b)
        else:
            ms = harness.timed(fn)[0] * 1e3
        if i >= warmup:
            out.append(ms)
    return out


def summary(ms: list[float]) -> dict[str, Any]:
    """Median, quartiles and range (harness.spread) of `ms`, with every value."""
    sp = harness.spread(ms)
    return {"median_ms": sp["median"], "q1_ms": sp["q1"], "q3_ms": sp["q3"], "min_ms": sp["min"],
            "max_ms": sp["max"], "all_ms": ms}


def run(args: argparse.Namespace) -> dict[str, Any]:
    dev = torch.device(args.device)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    seqs = packed_sequences(args.seq_lens, dev)
    n, h, g, d = seqs.bounds[-1], args.heads, args.kv_heads, args.dim
    gen = torch.Generator(device=dev).manual_seed(0)
    q, k, v = (torch.randn(heads, n, d, device=dev, dtype=dtype, generator=gen).requires_grad_()
               for heads in (h, g, g))
    grad_out = torch.randn(n, h, d, device=dev, dtype=dtype, generator=gen)

    def call(side: str) -> torch.Tensor:
        kk, vv = (k, v) if side == "native" else (k.repeat_interleave(h // g, 0), v.repeat_interleave(h // g, 0))
        return attend_packed(q, kk, vv, seqs)

    grads: dict[str, list[torch.Tensor]] = {}
    for side in SIDES:
        out = call(side)
        out.backward(grad_out)
        grads[side] = [out.detach().float()] + [t.grad.float() for t in (q, k, v)]
        q.grad = k.grad = v.grad = None
    diff = {name: {"max_abs": (a - b).abs().max().item(), "rel": ((a - b).norm() / b.norm().clamp_min(1e-30)).item()}
            for name, a, b in zip(("out", "dq", "dk", "dv"), grads["native"], grads["repeat"])}
    times: dict[str, dict[str, list[float]]] = {s: {"fwd": [], "fwd_bwd": []} for s in SIDES}
    for _ in range(args.rounds):
        for side in SIDES:
            with torch.no_grad():
                times[side]["fwd"] += timed(lambda s=side: call(s), args.reps, dev.type == "cuda")
            times[side]["fwd_bwd"] += timed(lambda s=side: call(s).backward(grad_out), args.reps, dev.type == "cuda")
        q.grad = k.grad = v.grad = None
    res: dict[str, Any] = {
        "varlen_kernel": varlen_available(q, 0.0), "args": harness.params(args),
        "tokens": n, "native_vs_repeat": diff,
        "sides": {s: {phase: summary(ms) for phase, ms in t.items()} for s, t in times.items()},
    }
    res["speedup"] = {phase: res["sides"]["repeat"][phase]["median_ms"] / res["sides"]["native"][phase]["median_ms"]
                      for phase in ("fwd", "fwd_bwd")}
    return res


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--heads", type=int, default=14)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--seq-lens", type=int, nargs="+", default=[540] * 30 + [184],
                    help="tokens of each packed sequence (default: one 16384-token micro-batch of 540-token rows)")
    ap.add_argument("--reps", type=int, default=20, help="timed calls per side per round")
    ap.add_argument("--rounds", type=int, default=2, help="rounds, each timing repeat then native")
    ap.add_argument("--json-out", type=Path, default=None)
    return ap.parse_args(argv)


def build_result(args: argparse.Namespace, res: dict[str, Any], env: dict[str, Any] | None = None
                 ) -> harness.Result:
    """The harness result of `run`'s output: one timing metric (ms) per side and phase, the rest kept."""
    out = harness.Result("varlen_gqa", harness.command_line(), args.rounds * args.reps,
                         env=env or harness.environment())
    for side, phases in res["sides"].items():
        for phase, t in phases.items():
            out.timing(f"{side}_{phase}_ms", t["all_ms"], unit="ms")
    for phase, value in res["speedup"].items():
        out.metric(f"speedup_{phase}", value, unit="repeat/native (medians)")
    out.extra.update(res)
    return out


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    res = run(args)
    out = build_result(args, res).write(path=args.json_out)
    for side in SIDES:
        t = res["sides"][side]
        print(f"[gqa] {side}: " + ", ".join(
            f"{p} {t[p]['median_ms']:.3f} ms [{t[p]['min_ms']:.3f}, {t[p]['max_ms']:.3f}]" for p in ("fwd", "fwd_bwd")))
    print(f"[gqa] repeat / native: {res['speedup']}; native vs repeat: {res['native_vs_repeat']}")
    print(f"[gqa] wrote {out}")


if __name__ == "__main__":
    main()
