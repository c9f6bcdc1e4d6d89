"""Multi-turn rollouts on an engine shared by tensor-parallel peers: one driver, peers in lock-step.

The TP peers of a vLLM `external_launcher` engine each hold one shard and call the engine SPMD: every rank
must add the same requests, abort the same ones and step at the same moments, or the collectives inside the
model forward pair up wrong (a hang, or silently mixed shards). Agent loops add a trajectory's next turn
whenever its tools return, which differs from rank to rank. So with tensor parallelism only the block's first
rank runs agent loops (all the block's rows) and drives its engine through `LockstepDriver`; the other ranks
run `follow`, which replays the driver's engine calls on their own engine:

    driver (tp rank 0)                             peer (tp rank > 0)
    agent loops -> generate -> _add / _abort       (no agent loops)
    _step: broadcast ("step", ops, last ids) --->  apply the ops in order; check last ids; _step
    close: broadcast ("stop", ops, last ids) --->  apply the ops; check; return

Most steps add nothing: `GroupChannel` then sends one small tensor (kind, payload size, digest), and the
pickled ops only when there are any (one object broadcast costs ~16x a tensor broadcast over gloo).

`ops` are the adds and aborts since the previous message, in the driver's order; `last ids` is a digest of the
requests the driver's previous step finished, so a peer whose engine took another path stops with an error
instead of running on out of step. This is the request-level analogue of verl's server mode, where one scheduler sends
every TP worker the same scheduled batch; here each rank keeps its own (deterministic) scheduler and is fed
identical calls.

An engine with TP workers of its own (SGLang: the schedulers of the owner's engine) needs none of this: the
owner runs the block's agent loops and its peers only receive the result (`rlpost.workers.agent_rollout`).

`StepChannel` is the transport: `GroupChannel` broadcasts over a torch.distributed group (gloo: the messages
are small Python objects).
"""

from __future__ import annotations

import abc
import zlib
from dataclasses import dataclass, field
from typing import Any

from rlpost.rollout.async_engine import SteppedEngine
from rlpost.rollout.base import SamplingSpec

# ("add", request_id, prompt_ids, spec) or ("abort", request_ids)
Op = tuple


class StepChannel(abc.ABC):
    """One-way messages from the driver to every peer of its block."""

    @abc.abstractmethod
    def send(self, message: Any) -> None:
        """Driver side: deliver `message` to every peer (blocks until they take it, for collectives)."""

    @abc.abstractmethod
    def recv(self) -> Any:
        """Peer side: the driver's next message."""


class GroupChannel(StepChannel):
    """Broadcast over a torch.distributed group from its rank `src` (a global rank). A message is
    (kind, ops, digest): a header tensor [kind, payload bytes, digest] goes every time, the pickled ops only
    when there are any."""

    _KINDS = ("step", "stop")

    def __init__(self, group: Any, src: int) -> None:
        self.group, self.src = group, src

    def send(self, message: Any) -> None:
        import pickle

        import torch
        import torch.distributed as dist

        kind, ops, digest = message
        payload = pickle.dumps(ops) if ops else b""
        header = torch.tensor([self._KINDS.index(kind), len(payload), digest], dtype=torch.int64)
        dist.broadcast(header, src=self.src, group=self.group)
        if payload:
            dist.broadcast(torch.frombuffer(bytearray(payload), dtype=torch.uint8), src=self.src, group=self.group)

    def recv(self) -> Any:
        import pickle

        import torch
        import torch.distributed as dist

        header = torch.zeros(3, dtype=torch.int64)
        dist.broadcast(header, src=self.src, group=self.group)
        kind, size, digest = (int(v) for v in header)
        ops: list = []
        if size:
            payload = torch.empty(size, dtype=torch.uint8)
            dist.broadcast(payload, src=self.src, group=self.group)
            ops = pickle.loads(payload.numpy().tobytes())
        return self._KINDS[kind], ops, digest


def finished_digest(request_ids: list[str]) -> int:
    """A digest of a step's finished request ids (order-free), as the peers compare it."""
    return zlib.crc32("\n".join(sorted(request_ids)).encode())


class LockstepError(RuntimeError):
    """A peer's engine finished other requests than the driver's in the same step."""


class LockstepDriver(SteppedEngine):
    """The driver's agent front: the agent loops' requests go to `inner` (the driver's own stepped engine,
    used through its `_add` / `_step` / `_abort` only) and every one of those calls is sent to the peers
    before the step it belongs to. `close` sends the last aborts and releases the peers.

    Attributes:
        steps: engine steps run (the peers run the same number).
    """

    def __init__(self, inner: SteppedEngine, channel: StepChannel) -> None:
        super().__init__()
        self.inner, self.channel = inner, channel
        self._ops: list[Op] = []
        self._last = finished_digest([])
        self.steps = 0

    def _add(self, request_id: str, prompt_ids: list[int], spec: SamplingSpec) -> None:
        self.inner._add(request_id, prompt_ids, spec)
        self._ops.append(("add", request_id, list(prompt_ids), spec))

    def _abort(self, request_ids: list[str]) -> None:
        self.inner._abort(request_ids)
        self._ops.append(("abort", list(request_ids)))

    def _flush(self, kind: str) -> None:
        ops, self._ops = self._ops, []
        self.channel.send((kind, ops, self._last))

    def _step(self) -> list[tuple[str, list[int], list[float] | None]]:
        self._flush("step")
        self.steps += 1
        finished = self.inner._step()
        self._last = finished_digest([rid for rid, _, _ in finished])
        return finished

    async def close(self) -> None:
        # every trajectory is done (or cancelled): no request may stay behind in the engines
        leftover = list(self._waiting)
        self._waiting.clear()
        if leftover:
            self._abort(leftover)
        if self._stepper is not None and not self._stepper.done():
            self._stepper.cancel()
        self._flush("stop")
        await self.inner.close()


@dataclass
class FollowStats:
    """What a peer replayed: its engine steps and the number of adds and aborts."""

    steps: int = 0
    adds: int = 0
    aborts: int = 0
    errors: list[str] = field(default_factory=list)


def _apply(engine: SteppedEngine, ops: list[Op], stats: FollowStats) -> None:
    for op in ops:
        if op[0] == "add":
            _, request_id, prompt_ids, spec = op
            engine._add(request_id, prompt_ids, spec)
            stats.adds += 1
        elif op[0] == "abort":
            engine._abort(op[1])
            stats.aborts += 1
        else:
            raise ValueError(f"lock-step message with an unknown engine call {op[0]!r}")


def follow(engine: SteppedEngine, channel: StepChannel) -> FollowStats:
    """Peer side: replay the driver's engine calls on `engine` until the driver's `close`.

    A step that fails here is remembered and the peer keeps following (the driver's own step fails the same
    way and ends its trajectories; leaving early would leave the driver waiting in the next broadcast); the
    first such error is raised once the driver is done.

    Raises:
        LockstepError: this engine finished other requests than the driver's in some step (after the driver
            has released the peers).
        RuntimeError: a step of this engine failed.
    """
    stats, last, diverged = FollowStats(), [], None
    while True:
        kind, ops, driver_last = channel.recv()
        if diverged is None and finished_digest(last) != driver_last:
            diverged = (f"tensor-parallel peers out of step after {stats.steps} engine steps: this rank's engine "
                        f"finished {sorted(last)} in its last step, the driver's engine other requests")
        _apply(engine, ops, stats)
        if kind == "stop":
            break
        stats.steps += 1
        try:
            last = [rid for rid, _, _ in engine._step()]
        except Exception as err:  # noqa: BLE001  (re-raised below, once the driver is done)
            stats.errors.append(f"{type(err).__name__}: {err}")
            last = []
    if diverged is not None:
        raise LockstepError(diverged)
    if stats.errors:
        raise RuntimeError(f"engine step failed on a tensor-parallel peer: {stats.errors[0]}")
    return stats
