"""Where the trainer's rollouts come from, and when: the hybrid engine, or separate rollout devices with up to
`trainer.staleness` generations running ahead of training.

    hybrid (actor_rollout_ref.hybrid_engine=true): the actor's workers generate; weights sync inside update_actor.
    split, staleness 0: the rollout group generates batch k, the actor trains on it, then sends its weights.
    split, staleness 1 (one-step-off-policy): while the actor trains on batch k, the rollout group generates
        batch k+1 with the weights of step k-1; the weights of step k are sent once that generation is done.

Every generated batch carries its policy version (the number of actor updates behind the weights that
generated it); `metrics()` logs it with the gap to the policy being trained. The gap is corrected like any
rollout/actor mismatch: `rollout_log_probs` against the actor's `old_log_probs` (algorithm.rollout_correction).

Dynamic sampling (algorithm.filter_groups) draws its further batches of a step from the same queue: each is
one generated ahead, and drawing it submits the next; the step's policy version is its oldest batch's.

A checkpoint keeps the batches generated ahead (`save`): a resumed run trains on the same batches.
"""

from __future__ import annotations

import os
from collections import deque
from typing import Any, Callable, Iterable, Iterator

import torch

from rlpost.protocol import DataProto

TICKET = "rollout_ticket"  # meta_info: which generation in flight belongs to this batch of prompts
PREPARED = "rollout_prepared"  # meta_info: uids given and prompts repeated rollout.n times
INFLIGHT_FILE = "rollout_inflight.pt"

Prepare = Callable[[DataProto], DataProto]
GenInputs = Callable[..., DataProto]  # (prepared batch, step=None) -> generation inputs


def build_rollouts(config: Any, workers: Any, prepare: Prepare, gen_inputs: GenInputs) -> HybridRollouts:
    """The rollouts of `config` (typed): hybrid, or split with `trainer.staleness`, connected."""
    if workers.rollout is None:
        return HybridRollouts(workers.actor_rollout, prepare, gen_inputs)
    rollouts = SplitRollouts(workers.actor_rollout, workers.rollout, config.trainer.staleness, prepare, gen_inputs)
    rollouts.connect()
    return rollouts


class HybridRollouts:
    """Generation on the actor's own workers (the hybrid engine); nothing runs ahead.

    Args:
        generate_group: the worker group whose blocking `generate_sequences` samples the responses.
        prepare: the trainer's step preparation of a batch of prompts (uids, `rollout.n` repeats).
        gen_inputs: the trainer's generation inputs of a prepared batch.
    """

    staleness = 0

    def __init__(self, generate_group: Any, prepare: Prepare, gen_inputs: Prepare) -> None:
        self.group, self.prepare, self.gen_inputs = generate_group, prepare, gen_inputs
        self.version = 0
        self._batch_versions: list[int] = []  # policy versions of the batches generated for this step

    def batches(self, dicts: Iterable[dict]) -> Iterator[DataProto]:
        """The prepared batches of prompts, one per step."""
        for d in dicts:
            yield self.prepare(DataProto.from_single_dict(d))

    def generate(self, batch: DataProto) -> DataProto:
        """The rollout output for a prepared batch."""
        self._batch_versions.append(self.version)
        return self.generate_sequences(self.gen_inputs(batch))

    def generate_sequences(self, gen_batch: DataProto) -> DataProto:
        """Blocking generation from ready generation inputs (validation, the ReMax greedy baseline)."""
        return self.group.generate_sequences(gen_batch)

    def sync_weights(self, metrics: dict[str, Any]) -> None:
        """After an actor update (the hybrid engine synced inside it)."""
        self.version += 1

    def metrics(self, step: int) -> dict[str, float]:
        self._batch_versions = []
        return {}

    def set_version(self, version: int) -> None:
        self.version = version

    def save(self, folder: str) -> None:
        """Nothing runs ahead: nothing to keep."""

    def load(self, folder: str) -> None:
        """Nothing runs ahead: nothing to restore."""


class SplitRollouts(HybridRollouts):
    """Rollout engines in their own worker group, up to `staleness` generations ahead of training.

    Args:
        actor_group / rollout_group: the split worker groups (`rlpost.workers.split_workers`).
        staleness: generations submitted before the batch being trained on (0: on-policy).
    """

    def __init__(self, actor_group: Any, rollout_group: Any, staleness: int, prepare: Prepare,
                 gen_inputs: Prepare) -> None:
        super().__init__(rollout_group, prepare, gen_inputs)
        self.actor_group, self.staleness = actor_group, staleness
        self._pending: dict[int, tuple[Any, int]] = {}  # ticket -> (future or output, policy version)
        self._queue: deque[DataProto] = deque()
        self._sync: list[Any] = []  # futures of the last weight transfer
        self._next_ticket = 0
        self._submitted = 0  # training step of the last batch submitted
        self._sync_metrics: dict[str, float] = {}

    def connect(self) -> None:
        """Form the transfer group (trainer rank 0 + every rollout rank) and send the initial weights."""
        host, port = self.actor_group.sync_endpoint()[0]
        metas = self.actor_group.weight_meta()[0]
        world = 1 + self.group.world_size
        futures = [self.actor_group.join_weight_sync(host, port, world, metas),
                   self.group.join_weight_sync(host, port, world, metas)]
        for future in futures:
            future.get()
        self.set_version(0)  # the engines start from the actor's initial weights

    def batches(self, dicts: Iterable[dict]) -> Iterator[DataProto]:
        """Prepared batches of prompts; each one's generation is submitted `staleness` steps ahead of its
        training step (so it uses the weights sent `staleness` updates ago)."""
        for d in dicts:
            self._submit(self.prepare(DataProto.from_single_dict(d)))
            while len(self._queue) > self.staleness:
                yield self._queue.popleft()
        while self._queue:
            yield self._queue.popleft()

    def _submit(self, batch: DataProto) -> None:
        ticket, self._next_ticket = self._next_ticket, self._next_ticket + 1
        self._submitted += 1
        batch.meta_info[TICKET] = ticket
        gen_batch = self.gen_inputs(batch, step=self._submitted)  # the step it trains at seeds its sampling
        self._pending[ticket] = (self.group.generate_sequences(gen_batch), self.version)
        self._queue.append(batch)

    def generate(self, batch: DataProto) -> DataProto:
        """The output submitted for `batch` (waiting for it), else generated now with the current weights."""
        ticket = batch.meta_info.pop(TICKET, None)
        if ticket in self._pending:
            result, version = self._pending.pop(ticket)
            self._batch_versions.append(version)
            out = result if isinstance(result, DataProto) else result.get()
        else:
            self._batch_versions.append(self.version)
            out = self.generate_sequences(self.gen_inputs(batch))
        self._wait_sync()  # a transfer queued behind that generation has finished (errors surface here)
        return out

    def generate_sequences(self, gen_batch: DataProto) -> DataProto:
        return self.group.generate_sequences(gen_batch).get()

    def sync_weights(self, metrics: dict[str, Any]) -> None:
        """Send the new weights. Staleness 0 waits for them to arrive (timed as `update_weights`); otherwise
        the transfer runs once the engines finish the generation they are on."""
        self._push()
        if self.staleness == 0:
            self._wait_sync()
            metrics["timing_s/update_weights"] = self._sync_metrics["timing_s/send_weights"]

    def _push(self) -> None:
        self._sync = [self.actor_group.send_weights(), self.group.receive_weights()]
        self.version += 1

    def _wait_sync(self) -> None:
        if self._sync:
            send, receive = (future.get() for future in self._sync)
            self._sync = []
            self._sync_metrics = {**send[0], "timing_s/receive_weights": max(receive)}

    def set_version(self, version: int) -> None:
        """After a resume: the actor's weights (version `version`) go to the engines first."""
        self._push()
        self._wait_sync()
        self.version = version
        self._submitted = version + len(self._queue)

    def metrics(self, step: int) -> dict[str, float]:
        """Policy version of the batch just trained on and its gap to the policy that trained on it; with
        dynamic sampling (several generation batches in one step) the oldest of them."""
        oldest = min(self._batch_versions, default=self.version)
        self._batch_versions = []
        return {"training/policy_version": oldest,
                "training/policy_staleness": step - 1 - oldest,
                "perf/weight_sync_bytes": self._sync_metrics.get("perf/weight_sync_bytes", 0.0)}

    def save(self, folder: str) -> None:
        """Write the batches generated ahead (waiting for them) with their outputs and versions."""
        items = []
        for batch in self._queue:
            ticket = batch.meta_info[TICKET]
            result, version = self._pending[ticket]
            out = result if isinstance(result, DataProto) else result.get()
            self._pending[ticket] = (out, version)
            items.append((batch, out, version))
        torch.save(items, os.path.join(folder, INFLIGHT_FILE))

    def load(self, folder: str) -> None:
        """Queue the batches a checkpoint kept, ahead of the data loader's next one."""
        path = os.path.join(folder, INFLIGHT_FILE)
        if not os.path.exists(path):
            return
        for batch, out, version in torch.load(path, weights_only=False):
            ticket, self._next_ticket = self._next_ticket, self._next_ticket + 1
            batch.meta_info[TICKET] = ticket
            self._pending[ticket] = (out, version)
            self._queue.append(batch)
