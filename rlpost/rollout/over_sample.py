"""`rollout.over_sample_rate`: a generation batch holds more prompt groups than the step trains on; once
ceil((1 - rate) x groups) groups have every response finished, the requests still running are aborted (verl's
rule: stop when (1 - over_sample_rate) of the requests are done, counted here in whole groups, because a group
estimator needs all n responses of a prompt). The slowest groups, the long tail, are the ones cut.

Pure asyncio over the engine's async `generate` (cancelling a request aborts it in the engine,
`rlpost.rollout.async_engine`); no engine, worker or Ray import.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from typing import Any


def groups_to_keep(num_groups: int, rate: float) -> int:
    """ceil((1 - rate) x num_groups), at least 1 (a float just above an integer is not rounded up)."""
    return max(1, math.ceil((1.0 - rate) * num_groups - 1e-9))


@dataclass
class OverSampled:
    """Outcome of `gather_first_groups`.

    Attributes:
        results: per row, the request's result, or None for a row of a cut group.
        cut: (B,) True on the rows of cut groups.
        aborted: (B,) True on the rows whose request was still running when the tail was cut.
    """

    results: list[Any]
    cut: list[bool]
    aborted: list[bool]


async def gather_first_groups(requests: Sequence[Awaitable], uids: Sequence[Any], keep: int) -> OverSampled:
    """Run every request at once; the moment `keep` groups (rows sharing a uid) have all finished, cancel the rest.

    Groups count in the order their last request finishes (requests finishing in one engine step: in the order
    the engine reports them), and the rest are cancelled in that same turn of the event loop, before the engine
    steps again. An exception of any request cancels the others and is raised.

    Args:
        requests: B awaitables (one engine request per row).
        uids: (B,) group id per row.
        keep: groups to keep (>= 1; all of them when there are fewer).
    """
    if len(requests) != len(uids):
        raise ValueError(f"{len(requests)} requests for {len(uids)} uids")
    left: dict[Any, int] = {}
    for uid in uids:
        left[uid] = left.get(uid, 0) + 1
    kept: list[Any] = []
    aborted = [False] * len(uids)
    tasks: list[asyncio.Task] = []

    def cancel_others(i: int, mark: bool) -> None:
        for j, task in enumerate(tasks):
            if not task.done() and j != i:
                aborted[j] = aborted[j] or mark
                task.cancel()

    async def one(i: int, request: Awaitable) -> Any:
        try:
            result = await request
        except Exception:
            cancel_others(i, False)  # one failed request fails the call: stop the others now
            raise
        uid = uids[i]
        left[uid] -= 1
        if left[uid] == 0 and len(kept) < keep:
            kept.append(uid)
            if len(kept) == keep:  # the tail: cancelling a request aborts it in the engine
                cancel_others(i, True)
        return result

    tasks.extend(asyncio.ensure_future(one(i, r)) for i, r in enumerate(requests))
    outcomes = await asyncio.gather(*tasks, return_exceptions=True)
    for outcome in outcomes:
        if isinstance(outcome, BaseException) and not isinstance(outcome, asyncio.CancelledError):
            raise outcome
    keep_set = set(kept)
    cut = [uid not in keep_set for uid in uids]
    results = [None if c else task.result() for c, task in zip(cut, tasks)]
    return OverSampled(results, cut, aborted)
