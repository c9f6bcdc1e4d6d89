"""Step timers, and the profiler each worker process runs on the steps the trainer picks.

Timers: `marked_timer` / `simple_timer` add a block's wall time to a dict (verl's names).

Profiling (`global_profiler.tool`): the trainer calls `start_profile(step, options)` / `stop_profile()` on
every worker group whose role has `profiler.enable`; colocated roles share one process, so this module
keeps one session per process and the capture spans from the first role's start to the last role's stop.
Worker methods decorated with `@phase(name)` are the phases inside a step:

    torch         torch.profiler chrome trace   <save_path>/step<S>_<roles or phase>_rank<R>.json
    torch_memory  CUDA allocator snapshot       <save_path>/step<S>_<roles or phase>_rank<R>.pickle
    nsys          cudaProfilerStart/Stop + NVTX ranges; nsys (Ray's nsight runtime_env) writes the report

With `discrete` every phase gets its own capture instead of one per step. `@phase` also records the peak
device memory of the phase (`perf/max_memory_allocated_gb/<phase>`, GPU only) for the worker's metrics; a
sleeping vLLM engine's pool, which the allocator still counts after sleep mode freed its pages, is left out
(`set_unbacked_bytes`).
"""

from __future__ import annotations

import functools
import os
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch

from rlpost.keys import META_METRICS

TOOLS = ("torch", "torch_memory", "nsys")
PEAK_PREFIX = "perf/max_memory_allocated_gb/"
PHASE_RANGE = "phase/"  # the torch trace's name of a phase's range


@contextmanager
def simple_timer(name: str, timing_raw: dict[str, float]) -> Iterator[None]:
    """Add the wall time of the block to `timing_raw[name]`."""
    start = time.perf_counter()
    try:
        yield
    finally:
        timing_raw[name] = timing_raw.get(name, 0.0) + time.perf_counter() - start


@contextmanager
def marked_timer(name: str, timing_raw: dict[str, float], *args: Any, **kwargs: Any) -> Iterator[None]:
    """verl's marked timer; its colour / domain arguments only matter to verl's NVTX markers."""
    with simple_timer(name, timing_raw):
        yield


@dataclass(frozen=True)
class ProfileOptions:
    """One role's profiling, resolved by the trainer from `global_profiler` and the role's `profiler`.

    Attributes:
        tool: one of TOOLS. ranks: ranks that capture (None: all). save_path: folder of the files.
        discrete: one capture per phase instead of per step. contents: torch profiler contents out of
            cpu, cuda, memory, shapes, stack. max_entries: allocation events a memory snapshot keeps.
    """

    role: str
    tool: str
    ranks: tuple[int, ...] | None
    save_path: str
    discrete: bool
    contents: tuple[str, ...]
    max_entries: int

    def captures(self, rank: int) -> bool:
        return self.ranks is None or rank in self.ranks


class _Capture:
    """One running capture of `tool`, written to `path` (without suffix) when stopped."""

    def __init__(self, options: ProfileOptions, path: str) -> None:
        self.options, self.path, self._prof = options, path, None
        tool = options.tool
        if tool == "torch":
            activities = [torch.profiler.ProfilerActivity.CPU] if "cpu" in options.contents else []
            if "cuda" in options.contents and torch.cuda.is_available():
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            self._prof = torch.profiler.profile(
                activities=activities or [torch.profiler.ProfilerActivity.CPU],
                record_shapes="shapes" in options.contents, profile_memory="memory" in options.contents,
                with_stack="stack" in options.contents)
            self._prof.__enter__()
        elif tool == "torch_memory":
            torch.cuda.memory._record_memory_history(max_entries=options.max_entries)
        elif tool == "nsys":
            torch.cuda.profiler.start()

    def stop(self) -> str | None:
        """End the capture; returns the file written (None for nsys, whose report nsys writes)."""
        tool = self.options.tool
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        if tool == "torch":
            self._prof.__exit__(None, None, None)
            self._prof.export_chrome_trace(self.path + ".json")
            return self.path + ".json"
        if tool == "torch_memory":
            torch.cuda.memory._dump_snapshot(self.path + ".pickle")
            torch.cuda.memory._record_memory_history(enabled=None)
            return self.path + ".pickle"
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
        return None


class _Session:
    """This process's profiling state: the roles inside a profiled step and the running capture."""

    def __init__(self) -> None:
        self.step: int | None = None
        self.rank = 0
        self.roles: dict[str, ProfileOptions] = {}  # roles between start_profile and stop_profile
        self.capture: _Capture | None = None  # the step's capture (not discrete)
        self.capture_roles: set[str] = set()
        self.written: list[str] = []

    def _path(self, options: ProfileOptions, tag: str) -> str:
        return os.path.join(os.path.expanduser(options.save_path), f"step{self.step}_{tag}_rank{self.rank}")

    def start(self, step: int, options: ProfileOptions, rank: int) -> None:
        if not options.captures(rank):
            return
        self.step, self.rank = step, rank
        self.roles[options.role] = options
        if not options.discrete:
            self.capture_roles.add(options.role)
            if self.capture is None:
                self.capture = _Capture(options, "")  # named at stop, after every colocated role

    def stop(self, role: str) -> None:
        if self.roles.pop(role, None) is None or self.roles or self.capture is None:
            return
        capture, self.capture = self.capture, None
        capture.path = self._path(capture.options, "+".join(sorted(self.capture_roles)))
        self.capture_roles = set()
        written = capture.stop()
        if written:
            self.written.append(written)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Inside a profiled step: an NVTX range (nsys), or a capture of its own for `discrete` roles."""
        active = list(self.roles.values())
        nsys = any(o.tool == "nsys" for o in active)
        discrete = [o for o in active if o.discrete]
        capture = _Capture(discrete[0], self._path(discrete[0], name)) if discrete and self.capture is None else None
        if nsys:
            torch.cuda.nvtx.range_push(name)
        # a range the torch trace shows (and scripts/trace_summary.py splits by) as `phase/<name>`
        labelled = torch.profiler.record_function(PHASE_RANGE + name) if any(o.tool == "torch" for o in active) \
            else nullcontext()
        try:
            with labelled:
                yield
        finally:
            if nsys:
                torch.cuda.nvtx.range_pop()
            if capture is not None:
                written = capture.stop()
                if written:
                    self.written.append(written)


SESSION = _Session()
GIB = 2**30


class PeakTracker:
    """Peak device bytes per phase from the caching allocator's counters, less the bytes those counters hold
    without device memory behind them ("unbacked"): a sleeping vLLM engine's pool, whose pages sleep mode
    unmaps while its tensors stay allocated. The arithmetic only (tested on CPU); `phase_memory` and
    `set_unbacked_bytes` feed it the counters' peaks since their last reset, and reset them after each call.

    Between two calls the unbacked bytes are constant, so the backed peak of that interval is the counter's
    peak less them; it is folded into every open phase (nested phases included) and the process lifetime."""

    def __init__(self) -> None:
        self.peaks: dict[str, float] = {}  # GiB per phase since the last drain
        self.unbacked = 0
        self._open: list[int] = []  # backed peak bytes of each open phase so far, innermost last
        self._lifetime = [0, 0]  # backed (allocated, reserved) peak bytes up to the last observation

    def _observe(self, raw_allocated: int, raw_reserved: int) -> None:
        backed = raw_allocated - self.unbacked
        self._open = [max(peak, backed) for peak in self._open]
        self._lifetime = [max(self._lifetime[0], backed), max(self._lifetime[1], raw_reserved - self.unbacked)]

    def set_unbacked(self, nbytes: int, raw_allocated: int = 0, raw_reserved: int = 0) -> None:
        """The unbacked bytes change to `nbytes`; the counters' peaks so far are given."""
        self._observe(raw_allocated, raw_reserved)
        self.unbacked = nbytes

    def lifetime(self, raw_allocated: int, raw_reserved: int) -> tuple[int, int]:
        """Backed (allocated, reserved) peak bytes of the process so far, given the counters' peaks since
        their last reset."""
        return (max(self._lifetime[0], raw_allocated - self.unbacked),
                max(self._lifetime[1], raw_reserved - self.unbacked))

    def enter(self, raw_allocated: int, raw_reserved: int) -> None:
        """A phase opens."""
        self._observe(raw_allocated, raw_reserved)
        self._open.append(0)

    def exit(self, name: str, raw_allocated: int, raw_reserved: int = 0) -> None:
        """The phase `name` closes."""
        self._observe(raw_allocated, raw_reserved)
        self.peaks[name] = max(self.peaks.get(name, 0.0), self._open.pop() / GIB)


TRACKER = PeakTracker()


def _counters() -> tuple[int, int] | None:
    """The allocator's (allocated, reserved) peaks since the last reset, then reset; None off GPU."""
    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return None
    peaks = torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()
    torch.cuda.reset_peak_memory_stats()
    return peaks


def set_unbacked_bytes(nbytes: int) -> None:
    """Tell the peak records how many allocated bytes have no device memory behind them from now on (a
    rollout engine's pool while it sleeps; 0 once it is awake)."""
    TRACKER.set_unbacked(nbytes, *(_counters() or (0, 0)))


def lifetime_peaks() -> tuple[int, int]:
    """(max allocated, max reserved) bytes of this process so far, across the per-phase resets, less a
    sleeping engine's unbacked pool (GPU only)."""
    return TRACKER.lifetime(torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved())


@contextmanager
def phase_memory(name: str) -> Iterator[None]:
    """Record the peak device memory of the block as `TRACKER.peaks[name]` (GPU only; an enclosing phase's
    peak includes its nested ones')."""
    counters = _counters()
    if counters is None:
        yield
        return
    TRACKER.enter(*counters)
    try:
        yield
    finally:
        TRACKER.exit(name, *(_counters() or (0, 0)))


@contextmanager
def block_peak() -> Iterator[dict[str, float]]:
    """Peak allocated GiB of the block, as `{"gib": value}` in the yielded dict after it (0.0 off GPU). For a
    caller timing worker calls (benchmarks): the workers' phases reset the allocator's peak counters, so
    `torch.cuda.max_memory_allocated()` after such a call only sees what followed its last phase."""
    out: dict[str, float] = {}
    name = f"_block_{id(out)}"
    try:
        with phase_memory(name):
            yield out
    finally:
        out["gib"] = TRACKER.peaks.pop(name, 0.0)


def drain_phase_peaks() -> dict[str, float]:
    """`{perf/max_memory_allocated_gb/<phase>: GiB}` recorded since the last call (empty on CPU)."""
    out = {PEAK_PREFIX + name: value for name, value in TRACKER.peaks.items()}
    TRACKER.peaks.clear()
    return out


def phase(name: str, report: bool = False) -> Callable:
    """Decorate a worker method as the phase `name`: profiled (NVTX range, or its own capture when
    `discrete`) and its peak memory recorded. With `report`, the method's returned metrics
    (`DataProto.meta_info["metrics"]`) get every peak recorded in this process since the last report."""

    def decorator(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with SESSION.phase(name), phase_memory(name):
                out = fn(*args, **kwargs)
            if report:
                metrics = getattr(out, "meta_info", {}).get(META_METRICS)
                if isinstance(metrics, dict):
                    metrics.update(drain_phase_peaks())
            return out

        return wrapper

    return decorator
