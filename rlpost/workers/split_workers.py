"""Split placement (`actor_rollout_ref.hybrid_engine=false`): the actor and the rollout engines in separate
worker groups on separate devices, weights sent between them over a collective (`rlpost.workers.weight_sync`).

`SplitActorWorker` is the actor without an engine; `SplitRolloutWorker` is the engine without an actor.
Both are `ActorRolloutRefWorker`s built with a narrower role (fewer parts, no colocated weight sync), plus a
`Transfer` part and the methods that drive it. The rollout's methods do
not block the driver, so it can train while the engines generate (one-step-off-policy).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from rlpost import keys
from rlpost.protocol import DataProto
from rlpost.single_controller.base import Dispatch, register
from rlpost.engine.fsdp import iter_full_params, to_dtype
from rlpost.utils.weight_names import checkpoint_names
from rlpost.engine.lora import merged_params
from rlpost.workers import weight_sync
from rlpost.workers.fsdp_workers import ActorRolloutRefWorker


def _bucket_bytes(config: Any) -> int:
    return config.rollout.checkpoint_engine.update_weights_bucket_megabytes * 2**20


@dataclass
class Transfer:
    """The weight-transfer part of a split worker: its handle on the transfer group (None on trainer ranks
    other than 0, which only gather) and the plan of tensors, the same on both sides."""

    group: Any = None
    metas: list[weight_sync.TensorMeta] = field(default_factory=list)

    def join(self, host: str, port: int, rank: int, world: int, metas: list, device: str, timeout_s: float) -> None:
        """Take the plan; rank >= 0 joins the group as that rank."""
        self.metas = metas
        if rank >= 0:
            self.group = weight_sync.connect(host, port, rank, world, device, timeout_s=timeout_s)


class SplitActorWorker(ActorRolloutRefWorker):
    """The actor of a split placement (role `actor`): trains; its rank 0 sends the weights."""

    def __init__(self, config: Any, role: str = "actor") -> None:
        super().__init__(config, role)
        self.transfer = Transfer()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def weight_meta(self) -> list[weight_sync.TensorMeta]:
        """Name, full shape and engine dtype of every tensor the engine receives, in sync order (no gather
        needed: with LoRA the merge runs on meta tensors of the full shapes)."""
        dtype = to_dtype(self.config.rollout.dtype)
        named = ((name, torch.empty(t.shape, device="meta")) for name, t in self.actor_module.state_dict().items())
        return [weight_sync.TensorMeta(name, tuple(t.shape), dtype) for name, t in self._engine_tensors(named, dtype)]

    def _engine_tensors(self, named: Any, dtype: torch.dtype) -> Any:
        """The engine's (name, tensor) pairs from the actor's full state-dict entries: with LoRA each adapter
        folded into its base weight under the HF name (the split engine serves plain weights)."""
        if self.actor_peft is None:
            return checkpoint_names(self.actor_module, ((name, t.to(dtype)) for name, t in named))
        return checkpoint_names(self.actor_module, merged_params(self.actor_module, named, dtype))

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def sync_endpoint(self) -> tuple[str, int]:
        """Where the transfer group meets: this node's IP and a free port (rank 0's answer is used)."""
        import ray

        from rlpost.utils.distributed import free_port

        return ray.util.get_node_ip_address(), free_port("")

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def join_weight_sync(self, host: str, port: int, world: int, metas: list) -> None:
        """Trainer rank 0 becomes rank 0 of the transfer group; the other trainer ranks only gather."""
        self.transfer.join(host, port, 0 if self.rank == 0 else -1, world, metas, self.device,
                           self.config.nccl_timeout)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def send_weights(self) -> dict[str, float]:
        """Gather the full parameters (all trainer ranks) and broadcast them, bucketed, from rank 0.

        Returns {`timing_s/send_weights`, `perf/weight_sync_bytes`}: waits for the rollout ranks to receive,
        so the time includes any generation they were finishing first."""
        start = time.perf_counter()
        fsdp_cfg = self.config.actor.fsdp_config
        self._onload(self.actor_module, None, fsdp_cfg)
        dtype = to_dtype(self.config.rollout.dtype)
        named = self._engine_tensors(iter_full_params(self.actor_module, None if self.actor_peft else dtype), dtype)
        sent = weight_sync.send(self.transfer.group, named, self.transfer.metas, _bucket_bytes(self.config))
        self._offload(self.actor_module, None, fsdp_cfg)
        return {"timing_s/send_weights": time.perf_counter() - start, "perf/weight_sync_bytes": float(sent)}


class SplitRolloutWorker(ActorRolloutRefWorker):
    """The rollout engines of a split placement (role `rollout`): generate; receive the weights."""

    def __init__(self, config: Any, role: str = "rollout") -> None:
        super().__init__(config, role)
        self.transfer = Transfer()
        self._idle_since: float | None = None  # when the engine's last call ended
        self._idle_s = 0.0  # seconds without a call since the last generation

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def join_weight_sync(self, host: str, port: int, world: int, metas: list) -> None:
        """Rollout rank r is rank 1 + r of the transfer group."""
        self.transfer.join(host, port, 1 + self.rank, world, metas, self.device, self.config.nccl_timeout)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def receive_weights(self) -> float:
        """Receive every bucket and stream it into the engine; returns the seconds it took."""
        start = self._busy()
        self.rollout.update_weights(weight_sync.receive(self.transfer.group, self.transfer.metas,
                                                        _bucket_bytes(self.config), self._model_device()))
        self._idle_since = time.perf_counter()
        return self._idle_since - start

    def _busy(self) -> float:
        """A call starts: add the time since the last one ended to the idle time; returns now."""
        now = time.perf_counter()
        if self._idle_since is not None:
            self._idle_s += now - self._idle_since
        return now

    def _model_device(self) -> str:
        return "cuda" if self.device == "cuda" else "cpu"

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO, blocking=False)
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """`ActorRolloutRefWorker.generate_sequences`, returning a future to the driver. Sampling is seeded
        by (global step, rank), so a batch generated again after a resume is the same batch. Adds the engine's
        idle seconds since the previous generation (`timing_s/rollout_idle` in the output's metrics)."""
        step = int(prompts.meta_info.get(keys.META_GLOBAL_STEP, 0))
        validate = bool(prompts.meta_info.get(keys.META_VALIDATE, False))
        torch.manual_seed(1_000_003 * step + 2 * self.rank + int(validate))
        self._busy()
        out = super().generate_sequences(prompts)
        return self._idle_noted(out)

    def _idle_noted(self, out: DataProto) -> DataProto:
        self._idle_since = time.perf_counter()
        out.meta_info.setdefault(keys.META_METRICS, {})["timing_s/rollout_idle"] = self._idle_s
        self._idle_s = 0.0
        return out

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO, blocking=False)
    def generate_segment(self, state: DataProto, version: int, tokens: int | None) -> DataProto:
        """One segment of a partial rollout (`rlpost.rollout.partial`): continue each unfinished row of `state`
        (a generation batch, or the state a previous segment returned) by at most `tokens` tokens, sampled by
        the engine's weights, policy `version`; `tokens=None` runs every row to its end and returns the rollout
        output (`generate_sequences`' keys plus `rollout_policy_versions`), else the state. Seeded by (global
        step, segment, rank), so a resumed run continues a checkpointed state exactly."""
        from rlpost.rollout import partial

        if not partial.is_state(state):
            state = partial.start(state, self.config.rollout.response_length)
        segment = int(state.meta_info.get(keys.META_ROLLOUT_SEGMENT, 0))
        step = int(state.meta_info.get(keys.META_GLOBAL_STEP, 0))
        torch.manual_seed(1_000_003 * step + 7_919 * (segment + 1) + 2 * self.rank)
        self._busy()
        req, rows = partial.request(state, tokens)
        if req is not None:
            caps = [int(c[0]) for c in req.non_tensor_batch[keys.RESPONSE_CAPS]]
            partial.splice(state, rows, super().generate_sequences(req), caps, version)
        state.meta_info[keys.META_ROLLOUT_SEGMENT] = segment + 1
        if tokens is not None:
            self._idle_since = time.perf_counter()
            return state
        return self._idle_noted(partial.finish(state))
