"""The parts an `ActorRolloutRefWorker` is built from, and how the rollout engine gets the actor's weights.

A worker holds up to three parts, chosen by its role:
- the actor: a trainable sharded model, its optimizer and LR schedule, run by `DataParallelPPOActor`;
- the reference: a frozen sharded model, or the LoRA actor itself viewed with its adapters disabled;
- the rollout: an engine (vLLM, SGLang, HF) plus the strategy that brings it up to the actor's weights.

Weight sync is a strategy picked once when the parts are built: `InPlaceSync` (full parameters gathered
bucket by bucket into the colocated engine), `LoraSync` (the adapter only, or merged weights), or none
(a split-placement engine receives its weights over a collective, `rlpost.workers.weight_sync`).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from rlpost.engine.fsdp import iter_full_params
from rlpost.utils.weight_names import checkpoint_names


@dataclass
class ModelPart:
    """One sharded model and the wrapper that runs it.

    Attributes:
        module: the FSDP2-sharded HF model.
        policy: its `DataParallelPPOActor` (log-probs; updates when trainable).
        fsdp_cfg: the role's `fsdp_config` (offload, reshard) the worker applies around each phase.
        sp: the Ulysses group, or None.
        optimizer / lr_scheduler: the actor's; None for a frozen model.
        peft: the PEFT model around `module` (LoRA), else None.
        view: context in which `module` computes this part's log-probs (the LoRA reference: adapters off).
    """

    module: torch.nn.Module
    policy: Any
    fsdp_cfg: Any
    sp: Any = None
    optimizer: Any = None
    lr_scheduler: Any = None
    peft: Any = None
    view: Callable[[], AbstractContextManager] = nullcontext


class EngineSync(Protocol):
    """Brings a colocated engine up to the actor's current weights; every rank calls `sync` (gathers are
    collectives). `engine_lora_rank` is the adapter rank the engine must be built to serve (0: plain weights)."""

    engine_lora_rank: int

    def sync(self, rollout: Any, dtype: torch.dtype) -> None: ...


class InPlaceSync:
    """The actor's full parameters, gathered `bucket_bytes` at a time and renamed to the checkpoint layout the
    engine's loader reads, streamed into the engine in `dtype`."""

    engine_lora_rank = 0

    def __init__(self, module: torch.nn.Module, bucket_bytes: int) -> None:
        self.module, self.bucket_bytes = module, bucket_bytes

    def sync(self, rollout: Any, dtype: torch.dtype) -> None:
        """Stream every parameter into `rollout.update_weights`."""
        rollout.update_weights(checkpoint_names(
            self.module, iter_full_params(self.module, dtype, bucket_bytes=self.bucket_bytes)))


def engine_sync(actor: ModelPart | None, config: Any) -> EngineSync | None:
    """The weight-sync strategy of a colocated engine (`config`: the `actor_rollout_ref` group): None without
    an actor in this worker (a split-placement engine), LoRA's with adapters, else in place."""
    if actor is None:
        return None
    if actor.peft is not None:
        from rlpost.workers.lora_sync import LoraSync

        return LoraSync(actor.module, actor.peft, config.model.lora.merge)
    return InPlaceSync(actor.module, config.rollout.update_weights_bucket_megabytes * 2**20)


class StepWatch:
    """Tells whether the actor's optimizer stepped since the colocated engine last got its weights.

    Any step counts (`update_actor`, or a recipe's own worker method that trains the actor), so the worker
    can sync on entering the next generation instead of sampling from stale weights, as verl's hybrid
    engine does. A change to the weights that is not an optimizer step (loading a state dict by hand) is
    not seen; `load_checkpoint` syncs itself.
    """

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.unsynced_steps = 0
        optimizer.register_step_post_hook(self._stepped)

    def _stepped(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self.unsynced_steps += 1

    def synced(self) -> None:
        self.unsynced_steps = 0
