"""Where a profiled step's time went, per rank and per phase, from the torch traces rlpost writes
(`global_profiler.tool=torch`, one `step<S>_<roles>_rank<R>.json` per rank; docs/profiling.md).

    python3 scripts/trace_summary.py outputs/profile/step4_*_rank*.json [--json-out summary.json]

Each phase is the `phase/<name>` range the worker opens around its call (`old_log_prob`, `ref`,
`update_actor`, ...). A phase called inside another (`update_weights` inside `update_actor`) is a row of its
own, and its time is left out of the outer phase's row. A device event belongs to the innermost phase in which
it starts on the GPU. For each rank and phase it prints (ms):

    wall      the range's length on the host, less the phases nested in it
    busy      the time at least one GPU kernel, copy or set ran (the union over streams, within the range)
    compute   the summed length of the kernels that are not NCCL's
    comm      the summed length of the NCCL kernels: the transfer, plus the wait for the other ranks, since a
              collective's kernel starts when this rank's stream reaches it and ends when every rank has joined
    copy      host <-> device copies and sets
    idle      wall - busy: the GPU waited on the host (Python, launches, data movement, the driver)

`wait` is a rank's comm less the smallest comm of that phase across the ranks: how much longer it waited than
the rank that waited least (a lower bound, since that rank may have waited too).
Off GPU (a CPU trace) only the wall and the longest operators (inclusive of the ones they call) are reported.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

sys.path.append(str(Path(__file__).resolve().parents[1]))  # after PYTHONPATH: a snapshot of rlpost put there wins
from rlpost.utils.profiler import PHASE_RANGE as PHASE  # noqa: E402  (the worker's name of a phase's range)

COMM = re.compile(r"^nccl", re.IGNORECASE)  # ncclDevKernel_AllGather_..., ncclKernel_...
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
    if found is None:
        raise ValueError(f"{path}: a trace's name must carry its rank, as rlpost writes it (step4_actor_rank0.json)")
    return int(found.group(1))


def _own_segments(start: float, end: float, children: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """[start, end) less the (sorted, disjoint) ranges of the phases nested in it."""
    segments, at = [], start
    for a, b in children:
        if a > at:
            segments.append((at, a))
        at = max(at, b)
    if at < end:
        segments.append((at, end))
    return segments


def _clipped(a: float, b: float, segments: list[tuple[float, float]]) -> list[tuple[float, float]]:
    return [(max(a, lo), min(b, hi)) for lo, hi in segments if a < hi and b > lo]


def summarize_trace(path: Path, top: int = 5) -> dict[str, Any]:
    """One rank's trace: per phase, the wall, GPU busy / compute / comm / copy / idle milliseconds, and
    the longest operators (CPU) or kernels (GPU)."""
    events = [e for e in json.loads(Path(path).read_text())["traceEvents"] if e.get("ph") == "X" and "dur" in e]
    phases = sorted((e for e in events if e.get("cat") == "user_annotation" and e.get("name", "").startswith(PHASE)),
                    key=lambda e: (e["ts"], -e["dur"]))
    ranges = [(ph["ts"], ph["ts"] + ph["dur"]) for ph in phases]

    def innermost(ts: float) -> int | None:
        inside = [i for i, (a, b) in enumerate(ranges) if a <= ts < b]
        return min(inside, key=lambda i: ranges[i][1] - ranges[i][0]) if inside else None

    device = [e for e in events if e.get("cat") in ("kernel", *COPY_CATS)]
    host = [e for e in events if e.get("cat") == "cpu_op"]
    owned: dict[int, list[dict]] = {i: [] for i in range(len(phases))}
    for e in (device or host):
        i = innermost(e["ts"])
        if i is not None:
            owned[i].append(e)
    out: dict[str, Any] = {"rank": _rank(Path(path)), "file": str(path), "phases": {}}
    for i, ph in enumerate(phases):
        start, end = ranges[i]
        children = [(a, b) for j, (a, b) in enumerate(ranges) if j != i and start <= a and b <= end
                    and (a, -(b - a)) > (start, -(end - start))]
        segments = _own_segments(start, end, sorted(children))
        wall = sum(b - a for a, b in segments)
        kernels = [e for e in owned[i] if e.get("cat") == "kernel"]
        row: dict[str, Any] = {"wall_ms": wall / 1e3, "kernels": len(kernels)}
        if device:  # a GPU trace (a CPU one has no device columns)
            comm = sum(e["dur"] for e in kernels if COMM.search(e["name"]))
            busy = union_length([c for e in owned[i] for c in _clipped(e["ts"], e["ts"] + e["dur"], segments)])
            row.update({"busy_ms": busy / 1e3, "compute_ms": (sum(e["dur"] for e in kernels) - comm) / 1e3,
                        "comm_ms": comm / 1e3,
                        "copy_ms": sum(e["dur"] for e in owned[i] if e["cat"] in COPY_CATS) / 1e3,
                        "idle_ms": (wall - busy) / 1e3})
        by_name: dict[str, float] = {}
        for e in owned[i]:
            if e.get("cat") in ("kernel", "cpu_op"):  # kernels on GPU, operators on CPU
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


def summarize_files(paths: list[Path], top: int = 5) -> list[dict[str, Any]]:
    """Every rank's summary (`summarize_trace`), in rank order, with the waits across them (`add_waits`)."""
    ranks = sorted((summarize_trace(p, top) for p in paths), key=lambda r: r["rank"])
    add_waits(ranks)
    return ranks


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("traces", nargs="+", type=Path, help="the ranks' .json traces of one step")
    ap.add_argument("--top", type=int, default=5, help="longest kernels / operators listed per phase")
    ap.add_argument("--json-out", type=Path, default=None)
    args = ap.parse_args()
    ranks = summarize_files(args.traces, args.top)
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
