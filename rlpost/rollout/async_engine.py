"""Async fronts over the in-process engines for the agent loops (the engine contract of `rlpost.agent.base`):

    async def generate(prompt_ids: list[int], sampling_params: dict) -> tuple[list[int], list[float] | None]

Many trajectories call `generate` at once, one event loop runs them all. Two fronts:

- `SteppedEngine` (continuous batching): a request enters the engine the moment its trajectory asks, and
  the engine advances one step (one forward over every running request) at a time; between steps the event
  loop runs, so trajectories whose turn just finished (or whose tools just answered) add their next request
  to the running batch. No trajectory waits for the slowest one of a "turn".
- `BatchedEngine` (the fallback for engines that only generate whole batches): the requests pending at a
  moment are generated together, the others wait for the next batch.

`sampling_params` is `sampling_kwargs(spec)` (the fields of `SamplingSpec`) with `max_tokens` set by the
caller. Engines stop at their `stop_ids` (the EOS ids), keep the EOS in the output and return exactly the
sampled ids.
"""

from __future__ import annotations

import abc
import asyncio
import itertools
from dataclasses import asdict, fields, replace
from typing import Any

from rlpost.rollout.base import SamplingSpec

# (token ids, log-probs of those ids or None)
Completion = tuple[list[int], "list[float] | None"]


def sampling_kwargs(spec: SamplingSpec) -> dict[str, Any]:
    """The `sampling_params` dict the agent loops pass to `generate` (a copy of the spec's fields)."""
    return asdict(spec)


def spec_of(sampling_params: dict[str, Any]) -> SamplingSpec:
    """`SamplingSpec` back from a `sampling_params` dict (its `max_tokens` is the caller's).

    Raises:
        KeyError: a field of `SamplingSpec` is missing (the dict did not come from `sampling_kwargs`).
    """
    missing = [f.name for f in fields(SamplingSpec) if f.name not in sampling_params]
    if missing:
        raise KeyError(f"sampling_params lacks {missing}: build it with rlpost.rollout.async_engine.sampling_kwargs")
    return SamplingSpec(**{f.name: sampling_params[f.name] for f in fields(SamplingSpec)})


class AgentEngine(abc.ABC):
    """What a rollout hands the agent loops: the async `generate` and a `close` run after the last
    trajectory of the call (engines that must stay in step with other ranks finish their share there)."""

    @abc.abstractmethod
    async def generate(self, prompt_ids: list[int], sampling_params: dict[str, Any]) -> Completion:
        """See the module docstring."""

    async def close(self) -> None:
        """Called once every trajectory of this rank has finished."""


class SteppedEngine(AgentEngine):
    """Continuous batching over an engine advanced one step at a time.

    Subclasses implement `_add` (queue a request), `_step` (one engine step; returns the requests that
    finished in it) and `_abort`. The step runs on the event loop's thread, so the engine is never called
    from two threads; between steps every other coroutine (tools, interactions, new requests) runs.

    Attributes:
        max_in_flight: most requests in the engine at one time, seen so far (for tests and metrics).
    """

    def __init__(self) -> None:
        self._waiting: dict[str, asyncio.Future] = {}
        self._ids = itertools.count()
        self._stepper: asyncio.Task | None = None
        self.max_in_flight = 0

    @abc.abstractmethod
    def _add(self, request_id: str, prompt_ids: list[int], spec: SamplingSpec) -> None:
        """Queue one request in the engine."""

    @abc.abstractmethod
    def _step(self) -> list[tuple[str, list[int], list[float] | None]]:
        """Advance the engine one step; return (request id, token ids, log-probs) of the finished requests."""

    @abc.abstractmethod
    def _abort(self, request_ids: list[str]) -> None:
        """Drop unfinished requests from the engine."""

    async def generate(self, prompt_ids: list[int], sampling_params: dict[str, Any]) -> Completion:
        spec = spec_of(sampling_params)
        if spec.max_tokens <= 0:
            return [], ([] if spec.logprobs else None)
        request_id = f"agent-{next(self._ids)}"
        future = asyncio.get_running_loop().create_future()
        self._add(request_id, list(prompt_ids), spec)
        self._waiting[request_id] = future
        self.max_in_flight = max(self.max_in_flight, len(self._waiting))
        if self._stepper is None or self._stepper.done():
            self._stepper = asyncio.ensure_future(self._run())
        try:
            return await future
        except asyncio.CancelledError:  # the trajectory was cancelled: its request must not keep the engine busy
            if self._waiting.pop(request_id, None) is not None:
                self._abort([request_id])
            raise

    async def _run(self) -> None:
        """Step while requests are in flight. Before each step, yield once to the event loop: trajectories
        that got their completion in the last step may queue their next request into this one."""
        while self._waiting:
            await asyncio.sleep(0)
            # requests whose trajectory was cancelled meanwhile leave before the step, not one step later
            gone = [rid for rid, future in self._waiting.items() if future.cancelled()]
            if gone:
                for rid in gone:
                    del self._waiting[rid]
                self._abort(gone)
                if not self._waiting:
                    return
            try:
                finished = self._step()
            except Exception as err:  # the engine failed: every waiting trajectory gets the error
                for future in self._waiting.values():
                    if not future.done():
                        future.set_exception(err)
                self._waiting.clear()
                return
            for request_id, token_ids, log_probs in finished:
                future = self._waiting.pop(request_id, None)
                if future is not None and not future.done():
                    future.set_result((token_ids, log_probs))


class BatchedEngine(AgentEngine):
    """The requests pending at one moment are generated as one batch (`_generate_batch`); requests that
    arrive meanwhile wait for the next batch. All requests of one batch share their sampling settings but
    `max_tokens` (the batch runs to the largest; each result is cut to its own).

    When ranks must run the same number of forward passes (an FSDP-sharded module), `_sync_round(has_work)`
    returns whether any rank has work: every rank then generates (those without work, a dummy request),
    and `close` keeps taking part in rounds until no rank has work left.
    """

    def __init__(self) -> None:
        self._pending: list[tuple[list[int], SamplingSpec, asyncio.Future]] = []
        self._runner: asyncio.Task | None = None
        self._settings: SamplingSpec | None = None
        self.batch_sizes: list[int] = []

    @abc.abstractmethod
    def _generate_batch(self, prompts: list[list[int]], spec: SamplingSpec) -> list[Completion]:
        """Generate one completion per prompt (at most spec.max_tokens ids each, cut after the first EOS)."""

    def _sync_round(self, has_work: bool) -> bool:
        """Whether any rank has work this round (single process: this one's)."""
        return has_work

    async def generate(self, prompt_ids: list[int], sampling_params: dict[str, Any]) -> Completion:
        spec = spec_of(sampling_params)
        if self._settings is None:
            self._settings = _with_max_tokens(spec, 0)
        elif _with_max_tokens(spec, 0) != self._settings:
            raise ValueError(f"{type(self).__name__}: all requests must share their sampling settings (max_tokens "
                             f"aside); got {spec} after {self._settings}")
        if spec.max_tokens <= 0:
            return [], ([] if spec.logprobs else None)
        future = asyncio.get_running_loop().create_future()
        self._pending.append((list(prompt_ids), spec, future))
        if self._runner is None or self._runner.done():
            self._runner = asyncio.ensure_future(self._run())
        return await future

    async def _run(self) -> None:
        while self._pending:
            # a few loop turns: trajectories that are about to ask (e.g. right after a tool) join this batch
            for _ in range(3):
                await asyncio.sleep(0)
            batch, self._pending = self._pending, []
            batch = [item for item in batch if not item[2].done()]  # cancelled trajectories
            if not batch:
                continue
            self._sync_round(True)
            limit = max(s.max_tokens for _, s, _ in batch)
            try:
                results = self._generate_batch([p for p, _, _ in batch], _with_max_tokens(batch[0][1], limit))
            except Exception as err:
                for _, _, future in batch:
                    if not future.done():
                        future.set_exception(err)
                continue
            self.batch_sizes.append(len(batch))
            for (_, s, future), (ids, log_probs) in zip(batch, results):
                if not future.done():
                    future.set_result((ids[: s.max_tokens], None if log_probs is None else log_probs[: s.max_tokens]))

    def _idle_round(self) -> None:
        """Take part in one round of the other ranks with a dummy request."""

    async def close(self) -> None:
        while self._sync_round(False):
            self._idle_round()


def _with_max_tokens(spec: SamplingSpec, max_tokens: int) -> SamplingSpec:
    return replace(spec, max_tokens=max_tokens)
