"""Fetching results of a group call with a time-out, and reporting failures as one error."""

from __future__ import annotations

import logging
import math
import re
import time
from dataclasses import dataclass

import ray

from rlpost.single_controller.ray.diagnostics import WorkerInfo, collect_stacks

logger = logging.getLogger(__name__)

# After the first failing rank, wait this long for other ranks to fail too, so all are named.
_FAILURE_GRACE_S = 2.0


class WorkerGroupError(RuntimeError):
    """A call on a worker group failed on one or more ranks.

    Attributes:
        group: worker group name; method: method name; failures: {rank: traceback text}.
    """

    def __init__(self, group: str, method: str, failures: dict[int, str], pending: list[int] | None = None):
        self.group, self.method, self.failures, self.pending = group, method, failures, pending or []
        lines = [f"{group}.{method} failed on rank(s) {sorted(failures)}"]
        if self.pending:
            lines[0] += f" (rank(s) {self.pending} had not answered)"
        for rank in sorted(failures):
            lines.append(f"--- rank {rank} ---\n{failures[rank]}")
        super().__init__("\n".join(lines))

    def __reduce__(self):
        return type(self), (self.group, self.method, self.failures, self.pending)


class WorkerGroupTimeoutError(WorkerGroupError, TimeoutError):
    """A call on a worker group did not finish within its time-out; `stacks` holds {rank: Python stacks}
    of the ranks that had not answered, when they could be collected."""

    def __init__(self, group: str, method: str, pending: list[int], timeout_s: float,
                 stacks: dict[int, str] | None = None, key: str = "trainer.ray_call_timeout"):
        self.timeout_s, self.stacks, self.key = timeout_s, stacks or {}, key
        text = f"{group}.{method} timed out after {timeout_s:.1f} s ({key}); rank(s) {pending} have not answered"
        RuntimeError.__init__(self, text + format_stacks(group, method, self.stacks))
        self.group, self.method, self.failures, self.pending = group, method, {}, pending

    def __reduce__(self):
        return type(self), (self.group, self.method, self.pending, self.timeout_s, self.stacks, self.key)


def format_stacks(group: str, method: str, stacks: dict[int, str]) -> str:
    """"\n--- rank r (role <group>, phase <method>) ---\n<stack>" per rank; empty without stacks."""
    return "".join(f"\n--- rank {rank} (role {group}, phase {method}) ---\n{stacks[rank]}" for rank in sorted(stacks))


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def error_text(exc: BaseException) -> str:
    # RayTaskError's text holds the remote traceback; other Ray errors (actor died) say why.
    return _ANSI.sub("", str(exc))


@dataclass
class Gatherer:
    """Picklable fetcher: `gatherer(refs)` -> outputs, raising WorkerGroupError / WorkerGroupTimeoutError."""

    group: str
    method: str
    ranks: list[int]
    timeout_s: float
    # Stall watchdog: after `stall_s` seconds the stacks of the ranks that have not answered are logged once
    # (the call keeps waiting until `timeout_s`). Needs `workers`, indexed by rank.
    stall_s: float | None = None
    workers: list[WorkerInfo] | None = None
    timeout_key: str = "trainer.ray_call_timeout"  # named in the time-out error

    def __call__(self, refs: list) -> list:
        rank_of = {ref: rank for ref, rank in zip(refs, self.ranks)}
        outputs, failures = {}, {}
        pending = list(refs)
        start = time.monotonic()
        deadline = start + self.timeout_s
        report_at = start + self.stall_s if self.stall_s and self.workers else math.inf
        while pending and not failures:
            stall_next = report_at < deadline
            wait_s = max(0.0, (report_at if stall_next else deadline) - time.monotonic())
            ready, pending = ray.wait(pending, num_returns=1, timeout=wait_s)
            if not ready:
                late = sorted(rank_of[r] for r in pending)
                if not stall_next:
                    raise WorkerGroupTimeoutError(self.group, self.method, late, self.timeout_s, self._stacks(late),
                                                  self.timeout_key)
                logger.warning("%s.%s has run for %.0f s (trainer.ray_stall_timeout); rank(s) %s have not answered; "
                               "it fails at %s=%.0f s. Python stacks:%s", self.group, self.method,
                               time.monotonic() - start, late, self.timeout_key, self.timeout_s,
                               format_stacks(self.group, self.method, self._stacks(late)))
                report_at = math.inf
            self._fetch(ready, rank_of, outputs, failures)
        if failures:
            if pending:
                grace = min(_FAILURE_GRACE_S, max(0.0, deadline - time.monotonic()))
                ready, pending = ray.wait(pending, num_returns=len(pending), timeout=grace)
                self._fetch(ready, rank_of, outputs, failures)
            for rank in failures if self.workers else ():  # a crashed engine's last words are in its log
                if self.workers[rank].log_file:
                    failures[rank] += f"\n(the output of rank {rank} is in {self.workers[rank].log_file})"
            raise WorkerGroupError(self.group, self.method, failures, sorted(rank_of[r] for r in pending))
        return [outputs[ref] for ref in refs]

    def _stacks(self, ranks: list[int]) -> dict[int, str]:
        if not self.workers:
            return {}
        return collect_stacks([self.workers[r] for r in ranks])

    @staticmethod
    def _fetch(ready: list, rank_of: dict, outputs: dict, failures: dict) -> None:
        for ref in ready:
            try:
                outputs[ref] = ray.get(ref)
            except Exception as exc:  # noqa: BLE001 - every failure is reported with its rank
                failures[rank_of[ref]] = error_text(exc)


def get_together(futures: list) -> list:
    """`[f.get() for f in futures]` for calls that wait on each other (the two sides of a collective), except
    that the first call to fail raises at once: after a rank fails, its peers' calls may never end.

    Each future is a `DataProtoFuture` of group calls, whose `get()` raises the group's own error (a future
    without Ray refs is simply fetched). Once the shortest stall time of their gatherers (else time-out) has
    passed with nothing failed, they are fetched in order, each with its own time-out and stall report.
    """
    owner = {ref: future for future in futures for ref in getattr(future, "futures", ())}
    windows = [f.fetch_fn.stall_s or f.fetch_fn.timeout_s for f in futures
               if isinstance(getattr(f, "fetch_fn", None), Gatherer)]
    pending, deadline = list(owner), time.monotonic() + min(windows, default=math.inf)
    while pending:
        wait_s = None if deadline == math.inf else max(0.0, deadline - time.monotonic())
        ready, pending = ray.wait(pending, num_returns=1, timeout=wait_s)
        if not ready:
            break
        try:
            ray.get(ready[0])
        except Exception:  # noqa: BLE001 - re-raised as the failing group's error
            owner[ready[0]].get()
            raise
    return [future.get() for future in futures]
