"""Where the trainer's rollouts come from, and when: the hybrid engine, or separate rollout devices with up to
`trainer.staleness` generations running ahead of training.

    hybrid (actor_rollout_ref.hybrid_engine=true): the actor's workers generate; weights sync inside update_actor.
    split, staleness 0: the rollout group generates batch k, the actor trains on it, then sends its weights.
    split, staleness 1 (one-step-off-policy): while the actor trains on batch k, the rollout group generates
        batch k+1 with the weights of step k-1; the weights of step k are sent once that generation is done.

    split, trainer.v1.trainer_mode=separate_async (fully asynchronous): the engines generate continuously into a
        bounded queue (`num_warmup_batches` generations beyond the batch being trained), the weights are pushed
        every `parameter_sync_step` updates, and the queue enforces the staleness bound
        (`sampler.max_off_policy_threshold`, strategy drop | wait). With `separate_async.partial_rollout` a
        queued generation runs `partial_rollout_tokens` tokens per row, is paused there and resumed after each
        weight push with the new weights (another `partial_rollout_tokens`), and runs to its end when its batch
        is taken: the tokens of one sample then come from several policy versions.

Every generated batch carries its policy version (the number of actor updates behind the weights that
generated it), per token as `rollout_policy_versions`; `metrics()` logs it with the gap to the policy being
trained, the queue's depth, trainer and rollout idle time and the staleness histogram. The gap is corrected like any
rollout/actor mismatch: `rollout_log_probs` against the actor's `old_log_probs` (algorithm.rollout_correction).

Dynamic sampling (algorithm.filter_groups) draws its further batches of a step from the same queue: each is
one generated ahead, and drawing it submits the next; the step's policy version is its oldest batch's.

A checkpoint keeps the batches generated ahead (`save`): a resumed run trains on the same batches.
"""

from __future__ import annotations

import os
import time
from collections import deque
from typing import Any, Callable, Iterable, Iterator

import torch

from rlpost import keys as K
from rlpost.protocol import DataProto
from rlpost.trainer.ppo.staleness import partial_metrics, staleness_metrics, token_versions

TICKET = "rollout_ticket"  # meta_info: which generation in flight belongs to this batch of prompts
PREPARED = "rollout_prepared"  # meta_info: uids given and prompts repeated rollout.n times
INFLIGHT_FILE = "rollout_inflight.pt"

Prepare = Callable[[DataProto], DataProto]
GenInputs = Callable[..., DataProto]  # (prepared batch, step=None) -> generation inputs


def build_rollouts(config: Any, workers: Any, prepare: Prepare, gen_inputs: GenInputs) -> HybridRollouts:
    """The rollouts of `config` (typed): hybrid, or split with `trainer.staleness` or the fully asynchronous
    queue of `trainer.v1` (trainer_mode=separate_async), connected."""
    if workers.rollout is None:
        return HybridRollouts(workers.actor_rollout, prepare, gen_inputs)
    from rlpost.trainer.config.async_rules import queue_depth, sync_every

    v1 = config.trainer.v1
    fully_async = v1.trainer_mode == "separate_async"
    partial = v1.separate_async.partial_rollout_tokens if fully_async and v1.separate_async.partial_rollout else None
    rollouts = SplitRollouts(workers.actor_rollout, workers.rollout, queue_depth(config), prepare, gen_inputs,
                             os.path.expanduser(config.trainer.default_local_dir), sync_every(config),
                             v1.sampler.max_off_policy_threshold if fully_async else None,
                             v1.sampler.max_off_policy_strategy, partial)
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
    """Rollout engines in their own worker group, generating into a bounded queue ahead of training.

    The queue holds up to `staleness` generations beyond the batch being trained, submitted in order, so the
    engines always have work. The weights are pushed every `sync_every` actor updates (each push queued behind
    the generations submitted before it). A batch's staleness (actor updates since the weights that generated
    it) is bounded by `bound` at the queue: `strategy="drop"` discards a batch over it and generates its
    prompts again with the current weights; `strategy="wait"` submits a generation only once it would be
    within the bound when trained.

    Args:
        actor_group / rollout_group: the split worker groups (`rlpost.workers.split_workers`).
        staleness: generations queued beyond the batch being trained (0: on-policy).
        sync_every: actor updates between two weight pushes.
        bound / strategy: the staleness bound (None: none) and what the queue does with a batch over it.
        partial_tokens: partial rollouts (None: off): tokens a queued generation's rows run before each pause.
    """

    def __init__(self, actor_group: Any, rollout_group: Any, staleness: int, prepare: Prepare,
                 gen_inputs: Prepare, checkpoint_root: str = "", sync_every: int = 1, bound: int | None = None,
                 strategy: str = "drop", partial_tokens: int | None = None) -> None:
        super().__init__(rollout_group, prepare, gen_inputs)
        self.actor_group, self.staleness = actor_group, staleness
        self.sync_every, self.bound, self.strategy = sync_every, bound, strategy
        self.checkpoint_root = checkpoint_root  # named when the run stops on a failed transfer
        self.updates = 0  # actor updates so far (the version of the policy being trained)
        self._pending: dict[int, tuple[Any, int]] = {}  # ticket -> (future or output, policy version)
        self._step_of: dict[int, int] = {}  # ticket -> the training step its generation is for (seeds it)
        self._queue: deque[DataProto] = deque()
        self._sync: list[Any] = []  # futures of the last weight transfer
        self._sync_ticket = 0  # the first generation submitted after it
        self._next_ticket = 0
        self._enqueued = 0  # training step of the last batch queued
        self._sync_metrics: dict[str, float] = {}
        self._step_metrics: dict[str, float] = {}  # queue and idle metrics of the step being trained
        self._versions: list[torch.Tensor] = []  # (B, R) per-token versions of the step's batches
        self._actor_updates = 0  # update_actor calls seen on the actor group
        self.partial_tokens = partial_tokens
        self._open: set[int] = set()  # tickets of partial rollouts paused (their result is a state, not an output)
        self._count_actor_updates()

    def _count_actor_updates(self) -> None:
        """Count the actor group's `update_actor` calls (its bound method wrapped on this driver), so that a
        generation after an update whose weights were never synced (a recipe's own fit() that does not call
        `sync_weights` / `checkpoint_manager.update_weights()`) syncs them first, as a hybrid engine syncs on
        entering generation."""
        update = self.actor_group.update_actor

        def counted(*args: Any, **kwargs: Any) -> Any:
            out = update(*args, **kwargs)
            self._actor_updates += 1
            return out

        self.actor_group.update_actor = counted

    def _sync_if_behind(self) -> None:
        while self._actor_updates > self.updates:  # updates sync_weights never heard of
            self.sync_weights({})

    def connect(self) -> None:
        """Form the transfer group (trainer rank 0 + every rollout rank) and send the initial weights."""
        host, port = self.actor_group.sync_endpoint()[0]
        metas = self.actor_group.weight_meta()[0]
        world = 1 + self.group.world_size
        from rlpost.single_controller.ray.errors import get_together

        get_together([self.actor_group.join_weight_sync(host, port, world, metas),
                      self.group.join_weight_sync(host, port, world, metas)])  # the first failure stops both
        self.set_version(0)  # the engines start from the actor's initial weights

    def batches(self, dicts: Iterable[dict]) -> Iterator[DataProto]:
        """Prepared batches of prompts; each one's generation is queued `staleness` steps ahead of its training
        step and submitted as soon as the staleness bound allows."""
        for d in dicts:
            self._enqueue(self.prepare(DataProto.from_single_dict(d)))
            while len(self._queue) > self.staleness:
                yield self._take()
        while self._queue:
            yield self._take()

    def _enqueue(self, batch: DataProto) -> None:
        self._sync_if_behind()
        ticket, self._next_ticket = self._next_ticket, self._next_ticket + 1
        self._enqueued += 1
        batch.meta_info[TICKET] = ticket
        self._step_of[ticket] = self._enqueued
        self._queue.append(batch)
        self._fill()

    def _take(self) -> DataProto:
        """The next batch to train on; notes the queue's depth (batches queued, of which finished) first."""
        if self._step_metrics:  # a further batch of the same step (dynamic sampling)
            return self._queue.popleft()
        ready = sum(1 for b in self._queue if _is_ready(self._pending.get(b.meta_info[TICKET], (None,))[0]))
        self._step_metrics = {"fully_async/queue_depth": float(len(self._queue)), "fully_async/queue_ready":
                              float(ready), "fully_async/trainer_idle_s": 0.0, "fully_async/rollout_idle_s": 0.0,
                              "fully_async/dropped_samples": 0.0, "fully_async/dropped_tokens": 0.0}
        if self.partial_tokens is not None:
            self._step_metrics.update(partial_metrics(None))
        return self._queue.popleft()

    def _allowed(self, ticket: int) -> bool:
        """Whether a generation submitted now would be within the bound when trained (strategy wait)."""
        return self.strategy != "wait" or self.bound is None or \
            self._step_of[ticket] - 1 - self.version <= self.bound

    def _fill(self) -> None:
        """Submit the queued generations, in order, as far as the staleness bound allows."""
        for batch in self._queue:
            ticket = batch.meta_info[TICKET]
            if ticket in self._pending:
                continue
            if not self._allowed(ticket):
                break
            self._submit(batch, ticket)

    def _submit(self, batch: DataProto, ticket: int) -> None:
        gen_batch = self.gen_inputs(batch, step=self._step_of[ticket])  # the step it trains at seeds its sampling
        try:
            if self.partial_tokens is None:
                self._pending[ticket] = (self.group.generate_sequences(gen_batch), self.version)
            else:
                self._pending[ticket] = (self.group.generate_segment(gen_batch, self.version, self.partial_tokens),
                                         self.version)
                self._open.add(ticket)
        except Exception:
            self._raise_first_failure()
            raise

    def generate(self, batch: DataProto) -> DataProto:
        """The output queued for `batch` (waiting for it; generated again if it is over the staleness bound),
        else generated now with the current weights. Adds `rollout_policy_versions` (B, R)."""
        self._sync_if_behind()
        start = time.perf_counter()
        ticket = batch.meta_info.pop(TICKET, None)
        if ticket is not None and ticket not in self._pending and ticket in self._step_of:
            self._submit(batch, ticket)  # held back by the bound (wait) until now
        if ticket in self._open:  # a paused partial rollout: run it to its end with the current weights
            self._resume(ticket, None)
        if ticket in self._pending:
            result, version = self._pending.pop(ticket)
            out = result if isinstance(result, DataProto) else result.get()
            step = self._step_of.pop(ticket)
            if self.bound is not None and self.updates - version > self.bound:
                self._drop(out)
                version = self.version
                out = self.generate_sequences(self.gen_inputs(batch, step=step))
        else:
            version = self.version
            out = self.generate_sequences(self.gen_inputs(batch))
        self._wait_sync()  # a transfer queued behind that generation has finished (errors surface here)
        out.meta_info.pop(TICKET, None)  # the driver's bookkeeping: batches of other generations concatenate
        out.meta_info.pop(K.META_ROLLOUT_SEGMENT, None)
        self._batch_versions.append(version)
        if K.ROLLOUT_POLICY_VERSIONS not in out.batch:  # a partial rollout's output records them per token
            out.batch[K.ROLLOUT_POLICY_VERSIONS] = token_versions(_response_mask(out), version)
        self._versions.append(out.batch[K.ROLLOUT_POLICY_VERSIONS])
        if self.partial_tokens is not None:
            for name, value in partial_metrics(out.batch[K.ROLLOUT_POLICY_VERSIONS]).items():
                self._add(name, value)
        idle = (out.meta_info.get(K.META_METRICS) or {}).get("timing_s/rollout_idle", 0.0)
        self._add("fully_async/rollout_idle_s", max(idle) if isinstance(idle, list) else idle)
        self._add("fully_async/trainer_idle_s", time.perf_counter() - start)
        return out

    def _resume(self, ticket: int, tokens: int | None) -> None:
        """Queue the next segment of the paused partial rollout `ticket` (after everything submitted so far, so
        with the weights the engines hold by then); `tokens=None` runs it to its end."""
        result, version = self._pending[ticket]
        try:
            self._pending[ticket] = (self.group.generate_segment(result, self.version, tokens), version)
        except Exception:
            self._raise_first_failure()
            raise
        if tokens is None:
            self._open.discard(ticket)

    def _add(self, name: str, value: float) -> None:
        self._step_metrics[name] = self._step_metrics.get(name, 0.0) + float(value)

    def _drop(self, out: DataProto) -> None:
        self._add("fully_async/dropped_samples", len(out))
        self._add("fully_async/dropped_tokens", float(_response_mask(out).sum()))

    def generate_sequences(self, gen_batch: DataProto) -> DataProto:
        """Generate now (validation, ReMax's greedy pass): queued behind any transfer, whose failure is named."""
        self._sync_if_behind()
        try:
            return self.group.generate_sequences(gen_batch).get()
        except Exception:
            self._raise_first_failure()
            raise

    def sync_weights(self, metrics: dict[str, Any]) -> None:
        """After an actor update: every `sync_every` updates send the new weights, then submit what the bound
        held back. Staleness 0 waits for them to arrive (timed as `update_weights`); otherwise the transfer
        runs once the engines finish the generations queued before it."""
        self.updates += 1
        if self.updates % self.sync_every:
            return
        self._push(self.updates)
        for ticket in sorted(self._open):  # paused at this push: resumed with the new weights
            self._resume(ticket, self.partial_tokens)
        if self.staleness == 0:
            self._wait_sync()
            metrics["timing_s/update_weights"] = self._sync_metrics["timing_s/send_weights"]
        self._fill()

    def _raise_first_failure(self) -> None:
        """After a call to the rollout group failed (e.g. its dispatch found a worker dead): raise the error of
        the first call queued there that failed, as the engines ran them in order: a generation submitted
        before the transfer, else the transfer."""
        for ticket in sorted(self._pending):
            result, version = self._pending[ticket]
            if self._sync and ticket >= self._sync_ticket:
                break
            self._pending[ticket] = (result if isinstance(result, DataProto) else result.get(), version)
        self._wait_sync()

    def _push(self, version: int) -> None:
        self._sync = [self.actor_group.send_weights(), self.group.receive_weights()]
        self._sync_ticket = self._next_ticket  # generations with a smaller ticket run before this transfer
        self.version = version

    def _wait_sync(self) -> None:
        """Wait for the last transfer. Its two sides wait on each other: the first to fail stops the run, with
        the worker that died named (a dead receiver makes the trainer's send fail too, or block)."""
        from rlpost.single_controller.ray.errors import get_together

        if not self._sync:
            return
        futures, self._sync = self._sync, []
        try:
            send, receive = get_together(futures)
        except Exception as err:
            raise transfer_failure([self.group, self.actor_group], self.version, self.checkpoint_root, err) from err
        self._sync_metrics = {**send[0], "timing_s/receive_weights": max(receive)}

    def set_version(self, version: int) -> None:
        """At start-up or after a resume: the actor's weights (version `version`) go to the engines first; the
        queued batches (from a checkpoint) are for the steps after it."""
        self.updates = version
        self._actor_updates = max(self._actor_updates, version)
        self._push(version)
        self._wait_sync()
        for i, batch in enumerate(self._queue):
            self._step_of[batch.meta_info[TICKET]] = version + 1 + i
        self._enqueued = version + len(self._queue)
        self._fill()

    def metrics(self, step: int) -> dict[str, float]:
        """Policy version of the batch just trained on and its gap to the policy that trained on it (with
        dynamic sampling, the oldest of the step's batches); the queue, idle and staleness metrics."""
        oldest = min(self._batch_versions, default=self.version)
        self._batch_versions = []
        out = {"training/policy_version": oldest,
               "training/policy_staleness": step - 1 - oldest,
               "perf/weight_sync_bytes": self._sync_metrics.get("perf/weight_sync_bytes", 0.0),
               **self._step_metrics}
        if self._versions:
            width = max(v.shape[1] for v in self._versions)
            padded = [torch.nn.functional.pad(v, (0, width - v.shape[1]), value=-1) for v in self._versions]
            out.update(staleness_metrics(torch.cat(padded), step - 1))
        self._versions, self._step_metrics = [], {}
        return out

    def save(self, folder: str) -> None:
        """Write the queued batches (waiting for those submitted) with their outputs and versions (a paused
        partial rollout: its state, flagged open); a batch the bound still held back is written without an
        output."""
        items = []
        for batch in self._queue:
            ticket = batch.meta_info[TICKET]
            if ticket not in self._pending:
                items.append((batch, None, None, False))
                continue
            result, version = self._pending[ticket]
            out = result if isinstance(result, DataProto) else result.get()
            self._pending[ticket] = (out, version)
            items.append((batch, out, version, ticket in self._open))
        torch.save(items, os.path.join(folder, INFLIGHT_FILE))

    def load(self, folder: str) -> None:
        """Queue the batches a checkpoint kept, ahead of the data loader's next one (`set_version` then
        numbers their steps and submits those without an output)."""
        path = os.path.join(folder, INFLIGHT_FILE)
        if not os.path.exists(path):
            return
        for batch, out, version, paused in torch.load(path, weights_only=False):
            ticket, self._next_ticket = self._next_ticket, self._next_ticket + 1
            batch.meta_info[TICKET] = ticket
            if out is not None:
                self._pending[ticket] = (out, version)
            if paused:
                self._open.add(ticket)
            self._queue.append(batch)


def _is_ready(result: Any) -> bool:
    """Whether a queued generation has finished (an output, or a future whose Ray objects are all ready)."""
    refs = getattr(result, "futures", None)
    if result is None:
        return False
    if not refs:
        return True
    import ray

    ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=0)
    return len(ready) == len(refs)


def _response_mask(out: DataProto) -> torch.Tensor:
    """(B, R) response-token mask of a rollout output (every position when the engine gave none)."""
    if K.RESPONSE_MASK in out.batch:
        return out.batch[K.RESPONSE_MASK]
    return torch.ones(out.batch[K.RESPONSES].shape, dtype=torch.int64)


class WeightTransferError(RuntimeError):
    """The weight transfer to the rollout pool (phase `update_weights`) failed; the cause is the first side's
    error."""


def transfer_failure(groups: list, version: int, checkpoint_root: str, err: Exception) -> WeightTransferError:
    """One error naming the phase, the worker(s) of `groups` found dead (group, rank, pid, log file, Ray's
    account) or else `err`'s first line, and the newest complete checkpoint under `checkpoint_root`."""
    from rlpost.checkpoint.manager import CheckpointManager

    head = f"update_weights (the weight transfer to the rollout pool, policy version {version}) failed"
    dead = []
    for group in groups:
        try:
            found = group.dead_workers()
        except Exception:  # noqa: BLE001 - the diagnosis must not replace the error it explains
            found = {}
        for rank, account in found.items():
            worker = group.workers[rank]
            where = f"its output is in {worker.log_file}" if worker.log_file else "its output went to the console"
            said = [line.strip() for line in account.splitlines() if line.strip()]
            said = said[:1] + [line.split(" Some common causes")[0] for line in said
                               if line.startswith("The actor is dead because")]
            dead.append(f"{group.name} rank {rank} (pid {worker.pid}) died; {where}\n  Ray: " + "\n  ".join(said))
        if dead:  # the rollout pool first: a dead receiver also fails the trainer's send
            break
    lines = [f"{head}: {dead[0]}", *dead[1:]] if dead else [f"{head}: {str(err).strip().splitlines()[0]}"]
    latest = CheckpointManager(checkpoint_root).find_latest_complete() if checkpoint_root else None
    lines.append(f"The newest checkpoint, {latest[1]} (step {latest[0]}), is complete (the transfer does not write "
                 "checkpoints): restart to resume from it (trainer.resume_mode=auto)." if latest else
                 f"No checkpoint had been saved under {checkpoint_root or 'trainer.default_local_dir'}.")
    return WeightTransferError("\n".join(lines))
