"""The one benchmark harness: environment capture, paired alternated rounds, ratio statistics, one result schema.

Every script under `benchmarks/` times, captures and writes through this module::

    from benchmarks import harness

    env = harness.environment()                       # commit, dirty, date, host, CPU, GPU, versions, CPU probe
    rounds = harness.alternate({"bare": run_bare, "rlpost": run_rlpost}, rounds=12)
    ratio = harness.paired_ratio([r["bare"]["s"] for r in rounds], [r["rlpost"]["s"] for r in rounds])
    lim = harness.limit_pair(before_s, after_s)        # a limit timed before and after; void past 5 %
    res = harness.Result("gen_alternate", command=harness.command_line(), reps=12, env=env)
    res.metric("gen_ratio", **ratio, unit="bare/rlpost")
    res.goal("A3", ratio, target=">= 0.95, ci_low >= 0.90")
    res.timing("step_s", step_seconds)                 # median, quartiles, min, max and every value
    res.extra["rounds"] = rounds                       # the script's own data, beside the schema keys
    path = res.write()                                 # benchmarks/results/<date>_<gpu|cpu>/gen_alternate.json
    harness.write_summary(path.parent, GOALS)          # summary.json: every goal id, unmeasured ones named
    harness.write_index()                              # benchmarks/results/INDEX.md from the files

Statistics:
- `paired_ratio`: the geometric mean of per-round ratios with a 95 % Student-t interval on the log ratios
  (exp(mean ± t·sd/√n)); rounds are paired, so a host drift that lands on both sides cancels in the ratio.
- `spread`: median, quartiles, min and max.
- `limit_pair`: a non-alternated limit is timed before and after the measured runs; the pair is void when the two
  differ by more than 5 % of the smaller, and its value is their mean otherwise.

A result file holds `{schema, benchmark, commit, dirty, date, host, gpu, command, reps, env, metrics, goals}`;
each metric `{value, ci_low, ci_high, unit, values}`, each goal `{value, ci_low, ci_high, target, met, command,
reps}` (a goal not measured has value None, met None and a `reason`). A metric of repeated timings
(`Result.timing`) has the median as its value and its `spread`; what else a script measured (`Result.extra`) sits
beside the schema keys. `validate` checks the schema, on every `write`; `write(path=...)` honours a script's
`--json-out`. In a copied tree without git metadata the commit and dirty flag come from `RLPOST_COMMIT` /
`RLPOST_DIRTY`.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import platform
import re
import shlex
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SCHEMA = "rlpost-bench/1"
REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
VOID_TOLERANCE = 0.05

# Two-sided 95 % quantiles of Student's t for 1..30 degrees of freedom (standard tables); above 30 the
# Cornish-Fisher expansion around the normal quantile is within 1e-3 of the table.
_T975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
         2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
         2.045, 2.042]


def t975(df: int) -> float:
    """The 0.975 quantile of Student's t with `df` degrees of freedom (df >= 1)."""
    if df < 1:
        raise ValueError(f"t975: df must be >= 1, got {df}")
    if df <= len(_T975):
        return _T975[df - 1]
    z = 1.959964
    return z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)


def cpu_probe_ms(loops: int = 200_000, reps: int = 3) -> float:
    """Fastest of `reps` timings of a fixed pure-Python loop on the calling thread, in ms: how fast this core runs
    the interpreter right now, apart from torch, vLLM and the GPU (lower is faster)."""
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        total = 0
        for i in range(loops):
            total += i * i
        best = min(best, time.perf_counter() - start)
    return best * 1000.0


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _commit_and_dirty() -> tuple[str | None, bool | None]:
    """(short commit, dirty flag); the environment variables win (a copied tree's git metadata can be stale)."""
    commit = os.environ.get("RLPOST_COMMIT") or _git("rev-parse", "--short", "HEAD")
    dirty_env = os.environ.get("RLPOST_DIRTY")
    if dirty_env is not None:
        return commit, dirty_env.strip().lower() in ("1", "true", "yes")
    status = _git("status", "--porcelain", "--untracked-files=no")
    return commit, (None if status is None else bool(status))


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _version(module: str) -> str | None:
    try:
        return __import__(module).__version__
    except Exception:  # noqa: BLE001 - a broken optional install reads as absent
        return None


def gpu_name() -> str | None:
    """The first CUDA device's name, or None without one. A process that has not started CUDA asks nvidia-smi
    first: a driver that only launches runs must not hold a CUDA context on the GPU they use."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_initialized():
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                                 text=True, timeout=30)
            if out.returncode == 0 and out.stdout.strip():
                return out.stdout.splitlines()[0].strip()
        except (OSError, subprocess.TimeoutExpired):
            pass
    return torch.cuda.get_device_name() if torch.cuda.is_available() else None


def slug(name: str | None) -> str:
    """File-name form of a device name: "NVIDIA H200" -> "h200", None -> "cpu"."""
    if not name:
        return "cpu"
    text = name.replace("NVIDIA ", "").split()[0] if name.startswith("NVIDIA") else name
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_") or "cpu"


def environment() -> dict[str, Any]:
    """What a result needs to be traced and compared: commit, dirty, date, host, CPU, GPU, versions, CPU probe."""
    commit, dirty = _commit_and_dirty()
    gpu = gpu_name()
    return {
        "commit": commit, "dirty": dirty,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": socket.gethostname(), "cpu": _cpu_model(), "cpu_count": os.cpu_count(), "gpu": gpu or "cpu",
        "python": platform.python_version(), "torch": _version("torch"), "vllm": _version("vllm"),
        "transformers": _version("transformers"),
        "cpu_probe_ms": cpu_probe_ms(reps=5),
    }


def command_line() -> str:
    """This process's command, quoted so that it can be pasted back into a shell (a module of this repository
    as `python -m <module>`)."""
    script = Path(sys.argv[0]).resolve() if sys.argv and sys.argv[0] else None
    head = [Path(sys.executable).name]
    if script is not None and script.suffix == ".py" and script.is_relative_to(REPO):
        head += ["-m", ".".join(script.relative_to(REPO).with_suffix("").parts)]
    else:
        head += sys.argv[:1]
    return " ".join(shlex.quote(a) for a in [*head, *sys.argv[1:]])


def timed(fn: Callable[[], Any], sync: Callable[[], None] | None = None) -> tuple[float, Any]:
    """(seconds, return value) of one `fn()`, `sync` (e.g. torch.cuda.synchronize) called before and after."""
    if sync is not None:
        sync()
    start = time.perf_counter()
    value = fn()
    if sync is not None:
        sync()
    return time.perf_counter() - start, value


TAG = "@@bench "  # prefix of a helper process's reply lines (engines log to the same stdout)


def reply(obj: Mapping[str, Any]) -> None:
    """Send one reply line from a helper process (a bare engine in its own process, say) to its parent."""
    print(TAG + json.dumps(obj, default=str), flush=True)


def read_reply(stream: Any, echo: Any, who: str = "the helper") -> dict[str, Any]:
    """The next reply line of a helper process, echoing its other output to `echo`; EOF means it died."""
    for line in stream:
        if line.startswith(TAG):
            return json.loads(line[len(TAG):])
        echo.write(line)
    raise RuntimeError(f"{who}'s process ended before replying (its output is above)")


def order(round_index: int, names: Sequence[str]) -> list[str]:
    """The sides' order in round `round_index`: as given on even rounds, reversed on odd ones."""
    return list(names) if round_index % 2 == 0 else list(reversed(names))


def alternate(sides: Mapping[str, Callable[[], Any]], rounds: int, probe: bool = True,
              on_round: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """Run each side once per round, the order swapping every round; a side returns seconds or a dict with "s".

    Returns one dict per round: {"round", "order", <side>: {"s", ..., "probe_ms"}}. The CPU probe runs just
    before each side, on the same thread. `on_round` sees each finished round (progress, partial writes).
    """
    out = []
    for r in range(rounds):
        row: dict[str, Any] = {"round": r, "order": order(r, list(sides))}
        for name in row["order"]:
            probe_ms = cpu_probe_ms() if probe else None
            value = sides[name]()
            entry = dict(value) if isinstance(value, Mapping) else {"s": float(value)}
            if "s" not in entry:
                raise ValueError(f"alternate: side {name!r} returned {sorted(entry)} without 's' (seconds)")
            entry["probe_ms"] = probe_ms
            row[name] = entry
        out.append(row)
        if on_round is not None:
            on_round(row)
    return out


def spread(values: Sequence[float]) -> dict[str, Any]:
    """Median, quartiles, min, max and count of `values` (empty: Nones and n=0)."""
    vals = sorted(float(v) for v in values)
    if not vals:
        return {"median": None, "q1": None, "q3": None, "min": None, "max": None, "n": 0}
    q1, q3 = (statistics.quantiles(vals, n=4, method="inclusive")[i] for i in (0, 2)) if len(vals) > 1 else (
        vals[0], vals[0])
    return {"median": statistics.median(vals), "q1": q1, "q3": q3, "min": vals[0], "max": vals[-1],
            "n": len(vals)}


def geomean_ci(ratios: Sequence[float]) -> dict[str, Any]:
    """Geometric mean of positive `ratios` with a 95 % Student-t interval on their logs (one value: no interval)."""
    if not ratios or any(r <= 0 or not math.isfinite(r) for r in ratios):
        raise ValueError(f"geomean_ci: needs positive finite ratios, got {list(ratios)}")
    logs = [math.log(r) for r in ratios]
    mean = statistics.fmean(logs)
    if len(logs) == 1:
        lo = hi = None
    else:
        half = t975(len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
        lo, hi = math.exp(mean - half), math.exp(mean + half)
    return {"value": math.exp(mean), "ci_low": lo, "ci_high": hi, "values": [float(r) for r in ratios],
            "n": len(ratios), "method": "geometric mean, 95% Student-t on log ratios"}


def paired_ratio(numerator: Sequence[float], denominator: Sequence[float]) -> dict[str, Any]:
    """`geomean_ci` of numerator[i] / denominator[i], round by round (both lists from the same rounds)."""
    if len(numerator) != len(denominator):
        raise ValueError(f"paired_ratio: {len(numerator)} numerators against {len(denominator)} denominators")
    return geomean_ci([n / d for n, d in zip(numerator, denominator)])


def limit_pair(before: Sequence[float], after: Sequence[float], tolerance: float = VOID_TOLERANCE
               ) -> dict[str, Any]:
    """A limit timed before and after the runs it bounds: medians, their relative drift, void past `tolerance`."""
    b, a = statistics.median(before), statistics.median(after)
    drift = abs(a - b) / min(a, b)
    return {"value": (a + b) / 2, "before": b, "after": a, "drift": drift, "void": drift > tolerance,
            "values": [float(v) for v in (*before, *after)]}


_CLAUSE = re.compile(r"^\s*(?:(value|ci_low|ci_high)\s*)?(>=|<=|>|<)\s*([-+0-9.eE]+)\s*$")


def met(target: str, value: float | None, ci_low: float | None = None, ci_high: float | None = None) -> bool | None:
    """Whether every clause of `target` holds ("">= 0.95, ci_low >= 0.90""; a bare clause is on the value).
    None when the value is missing; a clause on a missing bound fails."""
    if value is None:
        return None
    fields = {"value": value, "ci_low": ci_low, "ci_high": ci_high}
    ops = {">=": lambda x, y: x >= y, "<=": lambda x, y: x <= y, ">": lambda x, y: x > y, "<": lambda x, y: x < y}
    for clause in target.split(","):
        m = _CLAUSE.match(clause)
        if m is None:
            raise ValueError(f"met: cannot read the target clause {clause!r} of {target!r} (e.g. '>= 0.95')")
        got = fields[m.group(1) or "value"]
        if got is None or not ops[m.group(2)](got, float(m.group(3))):
            return False
    return True


# issue 48's protocol for the goals measured in paired, alternated rounds: >= 12 for generation, >= 5 for the
# training phases. Goals counted in steps of one run (C3: steps 2-5, E2, issue 49's) have no minimum here.
MIN_REPS = {"A3": 12, "A4": 12, **dict.fromkeys(("A1", "A1_limit", "A2", "A2_limit", "C1", "C2", "E1", "E1_update"), 5)}


def min_reps(goal_id: str) -> int:
    """The fewest paired rounds a goal may be judged on (a figure from fewer is kept with `met` None)."""
    return MIN_REPS.get(goal_id, 0)


@dataclass
class Result:
    """One benchmark's result: metrics and goals under one environment; `write` files it by date and device."""

    benchmark: str
    command: str
    reps: int
    env: dict[str, Any] = field(default_factory=environment)
    metrics: dict[str, dict[str, Any]] = field(default_factory=dict)
    goals: dict[str, dict[str, Any]] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    def metric(self, name: str, value: float | None, ci_low: float | None = None, ci_high: float | None = None,
               unit: str = "", values: Sequence[float] = (), **more: Any) -> dict[str, Any]:
        self.metrics[name] = {"value": value, "ci_low": ci_low, "ci_high": ci_high, "unit": unit,
                              "values": [float(v) for v in values], **more}
        return self.metrics[name]

    def timing(self, name: str, values: Sequence[float], unit: str = "s", **more: Any) -> dict[str, Any]:
        """Metric `name` from repeated measurements: the median as its value, with the `spread` (quartiles, min,
        max, n) and every value kept."""
        stats = spread(values)
        return self.metric(name, stats["median"], unit=unit, values=values, spread=stats, **more)

    def goal(self, goal_id: str, stats: Mapping[str, Any], target: str, reps: int | None = None,
             command: str | None = None, **more: Any) -> dict[str, Any]:
        """Goal `goal_id` from `stats` (value, ci_low, ci_high), checked against `target`."""
        value, lo, hi = stats.get("value"), stats.get("ci_low"), stats.get("ci_high")
        if reps is None:  # the rounds that produced the figure, not the rounds asked for
            reps = len(stats["values"]) if stats.get("values") else self.reps
        verdict = met(target, value, lo, hi)
        need = min_reps(goal_id)
        if reps < need and verdict is not None:
            verdict = None
            more = {"reason": f"{reps} rounds, the protocol asks for >= {need}: the figure is reported, not judged",
                    **more}
        self.goals[goal_id] = {"value": value, "ci_low": lo, "ci_high": hi, "target": target,
                               "met": verdict, "command": command or self.command, "reps": reps, **more}
        return self.goals[goal_id]

    def not_measured(self, goal_id: str, target: str, reason: str) -> dict[str, Any]:
        self.goals[goal_id] = not_measured(target, reason)
        return self.goals[goal_id]

    def to_dict(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "benchmark": self.benchmark, "commit": self.env.get("commit"),
                "dirty": self.env.get("dirty"), "date": self.env.get("date"), "host": self.env.get("host"),
                "gpu": self.env.get("gpu"), "command": self.command, "reps": self.reps, "env": self.env,
                "metrics": self.metrics, "goals": self.goals, **self.extra}

    def write(self, root: Path | None = None, session: Path | None = None, path: Path | None = None) -> Path:
        """Write `<session>/<benchmark>.json` (session: `session_dir(root, env)` unless given), or exactly `path`
        (a script's `--json-out`); returns the path written."""
        if path is None:
            out_dir = session or session_dir(root or RESULTS, self.env)
            path = out_dir / f"{self.benchmark}.json"
        data = self.to_dict()
        validate(data)
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(data, indent=1, default=str) + "\n")
        return Path(path)


def params(args: Any) -> dict[str, Any]:
    """A script's parsed arguments as JSON-safe values (paths as strings), for a result's extra payload."""
    return {k: v if isinstance(v, (bool, int, float, str, type(None))) or (
        isinstance(v, list) and all(isinstance(x, (bool, int, float, str)) for x in v)) else str(v)
            for k, v in vars(args).items()}


# Top-level keys of a result file and the types each must have (None allowed where git or a GPU can be absent).
_REQUIRED: dict[str, tuple[type, ...]] = {
    "schema": (str,), "benchmark": (str,), "commit": (str, type(None)), "dirty": (bool, type(None)),
    "date": (str,), "host": (str, type(None)), "gpu": (str,), "command": (str,), "reps": (int,), "env": (dict,),
    "metrics": (dict,), "goals": (dict,)}
_METRIC_KEYS = ("value", "ci_low", "ci_high", "unit", "values")
_GOAL_KEYS = ("value", "ci_low", "ci_high", "target", "met", "command", "reps")


def validate(data: Mapping[str, Any]) -> None:
    """Raise ValueError naming the first key of `data` (a result's `to_dict()` or a file read back) that does not
    follow the schema: the top-level keys and types, each metric's and goal's keys."""
    for key, types in _REQUIRED.items():
        if key not in data:
            raise ValueError(f"result {data.get('benchmark')!r}: missing key {key!r} (schema {SCHEMA})")
        if not isinstance(data[key], types) or (types == (int,) and isinstance(data[key], bool)):
            raise ValueError(f"result {data.get('benchmark')!r}: {key}={data[key]!r} is not "
                             f"{' or '.join(t.__name__ for t in types)}")
    if data["schema"] != SCHEMA:
        raise ValueError(f"result {data['benchmark']!r}: schema {data['schema']!r}, expected {SCHEMA!r}")
    for kind, entries, needed in (("metric", data["metrics"], _METRIC_KEYS), ("goal", data["goals"], _GOAL_KEYS)):
        for name, entry in entries.items():
            missing = [k for k in needed if k not in entry]
            if missing:
                raise ValueError(f"result {data['benchmark']!r}: {kind} {name!r} lacks {missing}")


def not_measured(target: str, reason: str) -> dict[str, Any]:
    """A goal entry that was not measured, with why."""
    return {"value": None, "ci_low": None, "ci_high": None, "target": target, "met": None, "command": None,
            "reps": 0, "reason": reason}


def session_dir(root: Path, env: Mapping[str, Any]) -> Path:
    """`root/<YYYY-MM-DD>_<gpu slug or cpu>`: one folder per device session and day."""
    return Path(root) / f"{str(env['date'])[:10]}_{slug(None if env.get('gpu') == 'cpu' else env.get('gpu'))}"


def _result_files(folder: Path) -> list[dict[str, Any]]:
    out = []
    for path in sorted(Path(folder).glob("*.json")):
        if path.name == "summary.json":
            continue
        try:
            data = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError):
            continue
        if isinstance(data, dict) and data.get("schema") == SCHEMA:
            out.append({**data, "_file": path.name})
    return out


def write_summary(folder: Path, expected: Mapping[str, str] | None = None,
                  reasons: Mapping[str, str] | None = None) -> Path:
    """`folder/summary.json`: every goal of the folder's result files (a later file wins a repeated id), plus
    each `expected` id (id -> target) none of them measured, marked not measured with `reasons[id]`."""
    results = _result_files(folder)
    if not results:
        raise ValueError(f"write_summary: no {SCHEMA} result file in {folder}")
    goals: dict[str, dict[str, Any]] = {}
    for res in sorted(results, key=lambda r: r.get("date") or ""):
        for gid, g in res.get("goals", {}).items():
            if g.get("value") is not None or gid not in goals:
                goals[gid] = {**g, "benchmark": res["benchmark"]}
    for gid, target in (expected or {}).items():
        goals.setdefault(gid, not_measured(target, (reasons or {}).get(gid, "no benchmark of this session ran it")))
    first = results[0]
    summary = {"schema": SCHEMA, "benchmark": "summary", "session": Path(folder).name,
               "commit": sorted({r.get("commit") for r in results} - {None}), "dirty": any(r.get("dirty")
                                                                                          for r in results),
               "date": max(r.get("date") or "" for r in results), "host": first.get("host"), "gpu": first.get("gpu"),
               "files": [r["_file"] for r in results], "goals": dict(sorted(goals.items()))}
    path = Path(folder) / "summary.json"
    path.write_text(json.dumps(summary, indent=1, default=str) + "\n")
    return path


def write_index(root: Path | None = None) -> Path:
    """`root/INDEX.md`, regenerated from the files: one section per session folder, newest first."""
    root = Path(root or RESULTS)
    lines = ["# Benchmark results", "", "Generated by `python -m benchmarks.harness index` from the files below; "
             "do not edit by hand. One folder per device session and day (`<date>_<gpu|cpu>`); files in the "
             f"`{SCHEMA}` schema show their commit and goals; older files, in their own shapes, are filed by the date "
             "they entered the repository and listed as they are.", ""]
    for folder in sorted((p for p in root.iterdir() if p.is_dir()), key=lambda p: p.name, reverse=True):
        lines += [f"## {folder.name}", ""]
        typed = {r["_file"]: r for r in _result_files(folder)}
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            rel = path.relative_to(folder).as_posix()
            res = typed.get(rel)
            if res is not None:
                goals = ", ".join(f"{k}={_fmt(v.get('value'))}" for k, v in res.get("goals", {}).items())
                lines.append(f"- [{rel}]({folder.name}/{rel}): {res['benchmark']}, commit {res.get('commit')}"
                             f"{' (dirty)' if res.get('dirty') else ''}, {res.get('reps')} reps"
                             + (f"; goals {goals}" if goals else ""))
            else:
                lines.append(f"- [{rel}]({folder.name}/{rel})")
        lines.append("")
    loose = sorted(p.name for p in root.iterdir() if p.is_file() and p.name != "INDEX.md")
    if loose:
        lines += ["## not filed by session", "", *(f"- [{n}]({n})" for n in loose), ""]
    path = root / "INDEX.md"
    path.write_text("\n".join(lines))
    return path


def _fmt(x: Any) -> str:
    return "n/a" if x is None else (f"{x:.3g}" if isinstance(x, float) else str(x))


if __name__ == "__main__":
    if sys.argv[1:] == ["index"]:
        print(write_index())
    else:
        sys.exit("usage: python -m benchmarks.harness index")
