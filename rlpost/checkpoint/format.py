"""The checkpoint format: every file and folder name of a checkpoint, and the shard meta a role folder carries.

Layout under `trainer.default_local_dir`::

    latest_checkpointed_iteration.txt   # LATEST_FILE: "N", the newest committed step (written last)
    global_step_N/                      # STEP_PREFIX + N; a save in progress is TMP_PREFIX + N
      actor/ critic/                    # ACTOR_DIR, CRITIC_DIR: one role folder each (below)
      data.pt                           # DATA_FILE: the dataloader's position
      manifest.json                     # MANIFEST_FILE: step, config hash, checksum of every file

A role folder (written by `rlpost.checkpoint.fsdp`, read back by it and by `rlpost.checkpoint.merger`)::

    model_world_size_{W}_rank_{r}.pt        # this rank's shard of every state-dict entry (HF names): the
                                            # DTensor's local piece as a plain CPU tensor
    optim_world_size_{W}_rank_{r}.pt        # this rank's shard of the optimiser state
    extra_state_world_size_{W}_rank_{r}.pt  # lr_scheduler state + torch/numpy/python RNG
    fsdp_meta.json                          # META_FILE: {"format": FORMAT, "world_size": W, "model_class",
                                            #  "params": {name: {"shape", "placement", "dtype"}}}
    huggingface/                            # HF_SUBDIR: config + tokenizer (+ full weights with hf_model)
    lora_adapter/                           # LORA_SUBDIR: a LoRA run's PEFT adapter

`Shard(0)` follows FSDP2 / `torch.chunk`: with `c = ceil(rows / W)` rank r holds rows `[r*c, min((r+1)*c,
rows))` (the last ranks may hold fewer, or none). `Replicate()` entries are full on every rank.

This module imports neither torch nor omegaconf.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Mapping

LATEST_FILE = "latest_checkpointed_iteration.txt"
MANIFEST_FILE = "manifest.json"
DATA_FILE = "data.pt"
ACTOR_DIR = "actor"
CRITIC_DIR = "critic"
STEP_PREFIX = "global_step_"
TMP_PREFIX = ".tmp_global_step_"
FORMAT = "rlpost-fsdp-v1"
META_FILE = "fsdp_meta.json"
HF_SUBDIR = "huggingface"
SHARD = "Shard(0)"
REPLICATE = "Replicate()"
LORA_SUBDIR = "lora_adapter"
# What a role folder may hold: this rank's model / optimiser / extra-state shard, and the full HF weights.
CONTENTS = ("model", "optimizer", "extra", "hf_model")
# The file kind of each per-rank content (`{kind}_world_size_{W}_rank_{r}.pt`).
RANK_FILE_KINDS = {"model": "model", "optimizer": "optim", "extra": "extra_state"}
_SHARD_FILE_RE = re.compile(r"^model_world_size_(\d+)_rank_(\d+)\.pt$")


def rank_file(local_dir: str | Path, content: str, world_size: int, rank: int) -> Path:
    """Path of rank `rank`'s file of `content` (model, optimizer or extra) in a role folder."""
    return Path(local_dir) / f"{RANK_FILE_KINDS[content]}_world_size_{world_size}_rank_{rank}.pt"


def shard_file(local_dir: str | Path, world_size: int, rank: int) -> Path:
    """Path of rank `rank`'s model shard."""
    return rank_file(local_dir, "model", world_size, rank)


def _placement_name(tensor: Any) -> str:
    """`Shard(0)` / `Replicate()` of a DTensor (duck-typed: no torch.distributed import); plain -> Replicate."""
    placements = getattr(tensor, "placements", None)
    if not placements:
        return REPLICATE
    if len(placements) != 1:
        raise ValueError(f"not supported yet: {len(placements)}-D device meshes (placements {placements})")
    placement = placements[0]
    if placement.is_shard(0):
        return SHARD
    if placement.is_replicate():
        return REPLICATE
    raise ValueError(f"not supported yet: placement {placement}")


def build_fsdp_meta(state_dict: Mapping[str, Any], world_size: int, model_class: str | None = None) -> dict:
    """The `fsdp_meta.json` content for a (DTensor) state dict: full shape, placement, dtype per name.

    Args:
        state_dict: `model.state_dict()` of the FSDP2 model (DTensor values report the full shape).
        world_size: number of ranks that write shards.
        model_class: HF class name; a leading "FSDP" that `fully_shard` adds to the class is removed.
    """
    if model_class is not None and model_class.startswith("FSDP"):
        model_class = model_class[len("FSDP"):]
    params = {
        name: {"shape": list(t.shape), "placement": _placement_name(t), "dtype": str(t.dtype).replace("torch.", "")}
        for name, t in state_dict.items()
    }
    return {"format": FORMAT, "world_size": int(world_size), "model_class": model_class, "params": params}


def save_fsdp_meta(local_dir: str | Path, meta: Mapping[str, Any]) -> Path:
    """Write `fsdp_meta.json` into `local_dir`."""
    path = Path(local_dir) / META_FILE
    path.write_text(json.dumps(meta, indent=1))
    return path


def read_fsdp_meta(local_dir: str | Path) -> dict:
    """The meta of a checkpoint folder; inferred from the shard file names when `fsdp_meta.json` is absent."""
    path = Path(local_dir) / META_FILE
    if path.exists():
        meta = json.loads(path.read_text())
        if meta.get("format") != FORMAT:
            raise ValueError(f"{path}: format {meta.get('format')!r}, expected {FORMAT!r}")
        return meta
    sizes = {int(m.group(1)) for p in Path(local_dir).glob("*.pt") if (m := _SHARD_FILE_RE.match(p.name))}
    if len(sizes) != 1:
        raise FileNotFoundError(f"{local_dir}: no {META_FILE} and shard files for world sizes {sorted(sizes)}")
    return {"format": FORMAT, "world_size": sizes.pop(), "model_class": None, "params": None}
