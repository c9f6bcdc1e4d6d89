"""Fetching results of a group call with a time-out, and reporting failures as one error."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

import ray

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
    """A call on a worker group did not finish within its time-out."""

    def __init__(self, group: str, method: str, pending: list[int], timeout_s: float):
        self.timeout_s = timeout_s
        RuntimeError.__init__(
            self, f"{group}.{method} timed out after {timeout_s:.1f} s; rank(s) {pending} have not answered"
        )
        self.group, self.method, self.failures, self.pending = group, method, {}, pending

    def __reduce__(self):
        return type(self), (self.group, self.method, self.pending, self.timeout_s)


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _error_text(exc: BaseException) -> str:
    # RayTaskError's text holds the remote traceback; other Ray errors (actor died) say why.
    return _ANSI.sub("", str(exc))


@dataclass
class Gatherer:
    """Picklable fetcher: `gatherer(refs)` -> outputs, raising WorkerGroupError / WorkerGroupTimeoutError."""

    group: str
    method: str
    ranks: list[int]
    timeout_s: float

    def __call__(self, refs: list) -> list:
        rank_of = {ref: rank for ref, rank in zip(refs, self.ranks)}
        outputs, failures = {}, {}
        pending = list(refs)
        deadline = time.monotonic() + self.timeout_s
        while pending and not failures:
            ready, pending = ray.wait(pending, num_returns=1, timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                raise WorkerGroupTimeoutError(self.group, self.method, sorted(rank_of[r] for r in pending),
                                              self.timeout_s)
            self._fetch(ready, rank_of, outputs, failures)
        if failures:
            if pending:
                grace = min(_FAILURE_GRACE_S, max(0.0, deadline - time.monotonic()))
                ready, pending = ray.wait(pending, num_returns=len(pending), timeout=grace)
                self._fetch(ready, rank_of, outputs, failures)
            raise WorkerGroupError(self.group, self.method, failures, sorted(rank_of[r] for r in pending))
        return [outputs[ref] for ref in refs]

    @staticmethod
    def _fetch(ready: list, rank_of: dict, outputs: dict, failures: dict) -> None:
        for ref in ready:
            try:
                outputs[ref] = ray.get(ref)
            except Exception as exc:  # noqa: BLE001 - every failure is reported with its rank
                failures[rank_of[ref]] = _error_text(exc)
