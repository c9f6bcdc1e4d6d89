"""Launching `main_ppo` runs for the end-to-end benchmarks (bench_async.py, bench_scale.py): one run in a
subprocess, its log in a file, each step's metrics line printed as it lands, with when it landed."""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


class GpuSampler:
    """`nvidia-smi` utilisation of every GPU every `period_s`, with the time of each sample (none without
    nvidia-smi)."""

    def __init__(self, period_s: float = 0.5) -> None:
        self.period_s, self.samples = period_s, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                out = subprocess.run(["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"],
                                     capture_output=True, text=True).stdout
            except FileNotFoundError:
                return
            self.samples.append((time.time(), [int(v) for v in out.split()]))
            self._stop.wait(self.period_s)

    def __enter__(self) -> GpuSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()

    def idle_fraction(self, start: float, end: float) -> float:
        """Fraction of (sample, GPU) pairs between `start` and `end` at 0 % utilisation."""
        values = [u for t, utils in self.samples if start <= t <= end for u in utils]
        return sum(u == 0 for u in values) / max(len(values), 1)


def step_times(metrics_file: Path) -> list[dict]:
    """The metrics of every step logged so far (one JSON object per line; a line still being written, without
    its newline, is left for the next look)."""
    if not metrics_file.exists():
        return []
    return [json.loads(line) for line in metrics_file.read_text().split("\n")[:-1] if line.strip()]


@dataclass
class Run:
    """One finished launch: exit status, the metrics rows, when each row landed (time.time())."""

    rc: int
    rows: list[dict]
    timed_out: bool = False
    arrivals: list[float] = field(default_factory=list)
    started: float = 0.0
    ended: float = 0.0
    sampler: GpuSampler | None = None

    @property
    def wall_s(self) -> float:
        return self.ended - self.started

    @property
    def startup_s(self) -> float | None:
        """From the launch to the start of step 1 (its metrics line's arrival less the step's own time)."""
        if not self.rows:
            return None
        return self.arrivals[0] - self.started - float(self.rows[0].get("timing_s/step", 0.0))

    def wall_s_per_step(self) -> float | None:
        """Median seconds between the metrics lines of consecutive steps, polled every 0.1 s (catches a wait
        outside a step's own timer); the last line can only be seen after the exit when it lands in the last
        0.1 s, so it is left out."""
        gaps = [b - a for a, b in zip(self.arrivals, self.arrivals[1:-1])]
        return statistics.median(gaps) if gaps else None


def launch(cmd: list[str], env: dict[str, str], run_dir: Path, log: Path, label: str,
           timeout_s: float | None = None, stop_ray: bool = True) -> Run:
    """Run `cmd` from the repo root with `env` added, its output into `log`; print each step's timings as its
    line lands in `run_dir/metrics.jsonl`. A run past `timeout_s` is killed with its whole process group and,
    with `stop_ray`, every Ray process of the host (`timed_out`); it keeps the rows it logged."""
    arrivals: list[float] = []
    started, timed_out = time.time(), False
    with GpuSampler() as sampler, log.open("w") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
        running = True
        while running:
            running = proc.poll() is None  # one more look after the exit: the last line may land just before
            if running and timeout_s is not None and time.time() - started > timeout_s:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                if stop_ray:
                    subprocess.run([sys.executable, "-m", "ray.scripts.scripts", "stop", "--force"],
                                   capture_output=True)
                running, timed_out = False, True
            landed = step_times(run_dir / "metrics.jsonl")
            for row in landed[len(arrivals):]:
                print(f"[{label}] step {row.get('step')}: " + ", ".join(
                    f"{k.removeprefix('timing_s/')} {v:.2f}" for k, v in row.items() if k.startswith("timing_s/")),
                    flush=True)
            arrivals += [time.time()] * (len(landed) - len(arrivals))
            time.sleep(0.1 if running else 0)
    return Run(rc=proc.returncode, rows=step_times(run_dir / "metrics.jsonl"), timed_out=timed_out,
               arrivals=arrivals, started=started, ended=time.time(), sampler=sampler)
