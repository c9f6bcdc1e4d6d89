"""Where a profiled step's time went, per rank and per phase, from the torch traces rlpost writes
(`global_profiler.tool=torch`, one `step<S>_<roles>_rank<R>.json` per rank; docs/profiling.md).

    python3 scripts/trace_summary.py outputs/profile/step4_*_rank*.json [--json-out summary.json]

Each phase is the `phase/<name>` range the worker opens around its call (`old_log_prob`, `ref`,
`update_actor`, ...). For each rank and phase it prints:

    wall      the range's length on the host (ms)
    busy      the time at least one GPU kernel, copy or set ran (the union over streams)
    compute   the summed length of the kernels that are not communication
    comm      the summed length of the NCCL kernels: the transfer, plus the wait for the slowest rank, since a
              collective's kernel runs from the moment this rank enters it
    copy      host <-> device copies and sets
    idle      wall - busy: the GPU waited on the host (Python, launches, data movement, the driver)

Across ranks, comm minus the smallest comm of the phase is the time a rank waited for the others (`wait`).
Off GPU (a CPU trace) only the wall and the longest operators (inclusive of the ones they call) are reported.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

PHASE = "phase/"
COMM = re.compile(r"nccl|all_?gather|reduce_?scatter|all_?reduce|broadcast", re.IGNORECASE)
COPY_CATS = ("gpu_memcpy", "gpu_memset")


def union_length(intervals: list[tuple[float, float]]) -> float:
    """Total length covered by `intervals` (start, end)."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def _rank(path: Path) -> int:
    found = re.search(r"rank(\d+)", path.name)
    return int(found.group(1)) if found else 0


def summarize_trace(path: Path, top: int = 5) -> dict[str, Any]:
    """One rank's trace: per phase, the wall, GPU busy / compute / comm / copy / idle milliseconds, and
    the longest operators (CPU) or kernels (GPU)."""
    events = [e for e in json.loads(Path(path).read_text())["traceEvents"] if e.get("ph") == "X" and "dur" in e]
    phases = [e for e in events if e.get("cat") == "user_annotation" and e.get("name", "").startswith(PHASE)]
    device = [e for e in events if e.get("cat") in ("kernel", *COPY_CATS)]
    out: dict[str, Any] = {"rank": _rank(Path(path)), "file": str(path), "phases": {}}
    for ph in sorted(phases, key=lambda e: e["ts"]):
        start, end = ph["ts"], ph["ts"] + ph["dur"]
        inside = [e for e in device if start <= e["ts"] < end]
        kernels = [e for e in inside if e["cat"] == "kernel"]
        comm = sum(e["dur"] for e in kernels if COMM.search(e["name"]))
        busy = union_length([(e["ts"], e["ts"] + e["dur"]) for e in inside])
        row = {"wall_ms": ph["dur"] / 1e3, "kernels": len(kernels)}
        if device:  # a GPU trace (a CPU one has no device columns)
            row.update({"busy_ms": busy / 1e3, "compute_ms": (sum(e["dur"] for e in kernels) - comm) / 1e3,
                        "comm_ms": comm / 1e3, "copy_ms": sum(e["dur"] for e in inside if e["cat"] in COPY_CATS) / 1e3,
                        "idle_ms": (ph["dur"] - busy) / 1e3})
        pool = kernels or [e for e in events if e.get("cat") == "cpu_op" and start <= e["ts"] < end]
        by_name: dict[str, float] = {}
        for e in pool:
            by_name[e["name"]] = by_name.get(e["name"], 0.0) + e["dur"] / 1e3
        row["top_ms"] = dict(sorted(by_name.items(), key=lambda kv: -kv[1])[:top])
        name = ph["name"].removeprefix(PHASE)
        if name in out["phases"]:  # a phase called twice in the step (generation of several batches)
            name = f"{name}#{sum(k.split('#')[0] == name for k in out['phases']) + 1}"
        out["phases"][name] = row
    return out


def add_waits(ranks: list[dict[str, Any]]) -> None:
    """`wait_ms` per rank and phase: its comm less the smallest comm of that phase across the ranks."""
    names = {name for r in ranks for name in r["phases"]}
    for name in names:
        rows = [r["phases"][name] for r in ranks if "comm_ms" in r["phases"].get(name, {})]
        if not rows:
            continue
        floor = min(row["comm_ms"] for row in rows)
        for row in rows:
            row["wait_ms"] = row["comm_ms"] - floor


def format_table(ranks: list[dict[str, Any]]) -> str:
    cols = ("wall_ms", "busy_ms", "compute_ms", "comm_ms", "wait_ms", "copy_ms", "idle_ms")
    lines = [f"{'phase':<16}{'rank':>5}" + "".join(f"{c.removesuffix('_ms'):>10}" for c in cols)]
    names = list(dict.fromkeys(n for r in ranks for n in r["phases"]))  # in the order the step ran them
    for name in names:
        for r in ranks:
            row = r["phases"].get(name)
            if row is None:
                continue
            cells = "".join(f"{row[c]:>10.1f}" if row.get(c) is not None else f"{'-':>10}" for c in cols)
            lines.append(f"{name:<16}{r['rank']:>5}{cells}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("traces", nargs="+", type=Path, help="the ranks' .json traces of one step")
    ap.add_argument("--top", type=int, default=5, help="longest kernels / operators listed per phase")
    ap.add_argument("--json-out", type=Path, default=None)
    args = ap.parse_args()
    ranks = sorted((summarize_trace(p, args.top) for p in args.traces), key=lambda r: r["rank"])
    add_waits(ranks)
    print(format_table(ranks))
    for r in ranks[:1]:
        for name, row in r["phases"].items():
            tops = ", ".join(f"{k[:60]} {v:.1f}" for k, v in row["top_ms"].items())
            print(f"rank {r['rank']} {name}: longest (ms) {tops}")
    if args.json_out:
        args.json_out.write_text(json.dumps({"ranks": ranks}, indent=1))
        print(f"wrote {args.json_out}")


if __name__ == "__main__":
    main()
