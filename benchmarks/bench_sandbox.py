"""Sandbox throughput and overhead: short Python solutions with 10 test cases each, run through rlpost's sandbox
service against the same programs run with no isolation (a plain subprocess in a fresh temp folder).

    python benchmarks/bench_sandbox.py [--solutions 4] [--rounds 2] [--pairs 30] [--levels 1,2,4,8]

- throughput: programs per second at client concurrency (= `max_concurrent`) 1/2/4/8, both sides alternated per
  round (`harness.alternate`); the service runs 8 workers, so the client's concurrency is the limit;
- overhead per program: `--pairs` single programs run back to back on both sides (order swapped every pair); the
  median of the paired differences (sandbox - bare), goal <= 30 ms; in the same pairs a service started with
  `--no-seccomp`, for the cost of the seccomp filter (sandbox - no_seccomp).
Every program's output is checked against its expected output on both sides. Writes
benchmarks/results/<date>_cpu/sandbox_throughput.json.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import harness  # noqa: E402
from examples.data_preprocess.code_synth import TASKS, reference, tests_for  # noqa: E402
from rlpost.sandbox.client import SandboxSlots, run_code  # noqa: E402
from rlpost.sandbox.local import LocalSandbox  # noqa: E402
from rlpost.sandbox.runner import _python  # noqa: E402

SERVICE_WORKERS = 8


def workload(n_solutions: int) -> list[tuple[str, str, str]]:
    """(program, stdin, expected stdout) for `n_solutions` solutions x 10 cases."""
    import random

    rng = random.Random(0)
    out = []
    for task in sorted(TASKS)[:n_solutions]:
        tests = tests_for(task, rng, 10)
        out += [(reference(task), i, o) for i, o in zip(tests["inputs"], tests["outputs"])]
    return out


def run_bare(program: str, stdin: str, expected: str) -> None:
    folder = tempfile.mkdtemp(prefix="bench-bare-")
    try:
        Path(folder, "main.py").write_text(program)
        proc = subprocess.run([_python(), "-I", "main.py"], input=stdin, cwd=folder, capture_output=True, text=True,
                              timeout=30)
        assert proc.stdout == expected, (proc.stdout, expected, proc.stderr)
    finally:
        shutil.rmtree(folder)


def run_boxed(url: str, slots: SandboxSlots, program: str, stdin: str, expected: str) -> dict:
    result = run_code(url, program, stdin, run_timeout=30, slots=slots)
    assert result["run_result"]["stdout"] == expected, result
    return result


def boxed_once(url: str, job: tuple[str, str, str]) -> dict:
    """Seconds of one program through the service, and the program's own CPU seconds (its rusage in the jail)."""
    seconds, result = harness.timed(lambda: run_boxed(url, None, *job))
    return {"s": seconds, "cpu_s": result["run_result"]["cpu_time"]}


def throughput(fn, jobs: list[tuple[str, str, str]], concurrency: int) -> dict:
    start = time.perf_counter()
    with cf.ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(lambda job: fn(*job), jobs))
    seconds = time.perf_counter() - start
    return {"s": seconds, "programs_per_s": len(jobs) / seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--solutions", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--pairs", type=int, default=30)
    parser.add_argument("--levels", default="1,2,4,8")
    args = parser.parse_args()
    jobs = workload(args.solutions)
    env = harness.environment()
    env["load_average"] = os.getloadavg()
    res = harness.Result("sandbox_throughput", command=harness.command_line(), reps=args.rounds, env=env)
    service = LocalSandbox(workers=SERVICE_WORKERS)
    plain = LocalSandbox(workers=1, seccomp=False)  # only for the paired cost of the seccomp filter
    try:
        for c in (int(x) for x in args.levels.split(",")):
            slots = SandboxSlots(c, f"bench-{os.getpid()}-{c}")
            rounds = harness.alternate({
                "bare": lambda c=c: throughput(run_bare, jobs, c),
                "sandbox": lambda c=c, slots=slots: throughput(
                    lambda *job: run_boxed(service.url, slots, *job), jobs, c)}, rounds=args.rounds)
            for side in ("bare", "sandbox"):
                rates = [r[side]["programs_per_s"] for r in rounds]
                res.metric(f"{side}_programs_per_s_c{c}", statistics.median(rates), unit="programs/s", values=rates)
            ratio = harness.paired_ratio([r["sandbox"]["s"] for r in rounds], [r["bare"]["s"] for r in rounds])
            res.metric(f"time_ratio_c{c}", **ratio, unit="sandbox/bare")
            print(f"c={c}: bare {res.metrics[f'bare_programs_per_s_c{c}']['value']:.1f}/s, sandbox "
                  f"{res.metrics[f'sandbox_programs_per_s_c{c}']['value']:.1f}/s", flush=True)
        pairs = harness.alternate({
            "bare": lambda: harness.timed(lambda: run_bare(*jobs[0]))[0],
            "sandbox": lambda: boxed_once(service.url, jobs[0]),
            "no_seccomp": lambda: boxed_once(plain.url, jobs[0])}, rounds=args.pairs)
        diffs_ms = [(p["sandbox"]["s"] - p["bare"]["s"]) * 1e3 for p in pairs]
        spread = harness.spread(diffs_ms)
        res.metric("overhead_ms_per_program", spread["median"], spread["q1"], spread["q3"], unit="ms",
                   values=diffs_ms, bare_median_ms=statistics.median(p["bare"]["s"] for p in pairs) * 1e3,
                   sandbox_median_ms=statistics.median(p["sandbox"]["s"] for p in pairs) * 1e3)
        res.goal("sandbox_overhead", {"value": spread["median"]}, target="<= 30", reps=args.pairs)
        filter_ms = harness.spread([(p["sandbox"]["s"] - p["no_seccomp"]["s"]) * 1e3 for p in pairs])
        res.metric("seccomp_ms_per_program", filter_ms["median"], filter_ms["q1"], filter_ms["q3"], unit="ms",
                   note="paired: the service with the seccomp filter minus one started with --no-seccomp")
        filter_cpu = harness.spread([(p["sandbox"]["cpu_s"] - p["no_seccomp"]["cpu_s"]) * 1e3 for p in pairs])
        res.metric("seccomp_cpu_ms_per_program", filter_cpu["median"], filter_cpu["q1"], filter_cpu["q3"], unit="ms",
                   note="the program's own CPU time (user + system), with the filter minus without, paired",
                   with_median_ms=statistics.median(p["sandbox"]["cpu_s"] for p in pairs) * 1e3,
                   without_median_ms=statistics.median(p["no_seccomp"]["cpu_s"] for p in pairs) * 1e3)
        print(f"seccomp filter: {filter_ms['median']:+.1f} ms wall, {filter_cpu['median']:+.1f} ms CPU per program "
              f"(median of {args.pairs} pairs)", flush=True)
    finally:
        service.stop()
        plain.stop()
    env["load_average_after"] = os.getloadavg()
    path = res.write()
    print(f"overhead per program (median of {args.pairs} pairs): {spread['median']:.1f} ms; wrote {path}")


if __name__ == "__main__":
    main()
