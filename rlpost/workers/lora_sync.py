"""Moving a LoRA actor's weights into its rollout engine, in one of two ways (`actor_rollout_ref.model.lora.merge`).

- merge=true: each adapter is folded into its base weight while the full tensors stream into the engine, as
  full fine-tuning syncs; the engine needs no LoRA support and generates at base-model speed.
- merge=false: the engine loads the frozen base from `model.path` itself (it is never synced: it never changes)
  and serves the adapter (vLLM's LoRA); after each update only the adapter tensors move, in the engine's dtype:
  handed to the engine in memory (`load_adapter_tensors`), or, for an engine that cannot take them so, through a
  PEFT folder in shared memory that the engine reads.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from typing import Any

import torch
import torch.distributed as dist

from rlpost.rollout.base import BaseRollout
from rlpost.engine.fsdp import iter_full_params
from rlpost.utils.weight_names import checkpoint_names
from rlpost.engine.lora import ADAPTER_NAME, adapter_tensors, is_adapter_entry, merged_params, save_adapter


def _scratch_dir() -> str:
    """A private folder for this rank's adapter, in /dev/shm when the machine has it (no disk round trip)."""
    root = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    rank = dist.get_rank() if dist.is_initialized() else 0
    path = tempfile.mkdtemp(prefix=f"rlpost_lora_rank{rank}_", dir=root)
    atexit.register(shutil.rmtree, path, True)
    return path


class LoraSync:
    """Syncs a LoRA actor into its engine.

    Args:
        module: the sharded HF model holding the adapters (every rank calls `sync`: gathers are collectives).
        peft_model: the PEFT model around it (its adapter config is what the engine reads).
        merge: `actor_rollout_ref.model.lora.merge`.

    Attributes:
        engine_lora_rank: the adapter rank the engine must serve (0 with merge: it serves plain weights).
    """

    def __init__(self, module: torch.nn.Module, peft_model: Any, merge: bool) -> None:
        self.module, self.merge = module, merge
        self.peft_config = peft_model.peft_config[ADAPTER_NAME]
        self.engine_lora_rank = 0 if merge else int(self.peft_config.r)
        self._dir: str | None = None

    def sync(self, rollout: BaseRollout, dtype: torch.dtype) -> None:
        """Bring the engine up to the actor's current weights (engine tensors in `dtype`)."""
        if self.merge:
            rollout.update_weights(checkpoint_names(self.module,
                                                    merged_params(self.module, iter_full_params(self.module), dtype)))
            return
        # the base is never gathered; the float32 adapters are cast on their device, as the engine would on its own
        tensors = adapter_tensors(iter_full_params(self.module, keep=is_adapter_entry), dtype)
        if rollout.load_adapter_tensors(tensors, self.peft_config):
            return
        self._dir = self._dir or _scratch_dir()
        rollout.load_adapter(save_adapter(self._dir, tensors, self.peft_config))
