"""Per-rank checkpoints of an FSDP2 model: shards of the model and AdamW state, LR scheduler and RNG state.

The role folder's layout is `rlpost.checkpoint.format`'s (one file per rank and content; reload needs the same
world size). What each save writes:
    model shards + fsdp_meta.json       with content "model" (rank 0 writes the meta: full shapes, placements)
    optim / extra_state shards          with "optimizer" / "extra"
    huggingface/                        config.json (+ generation_config) + tokenizer, always, rank 0 writes;
                                        with content "hf_model" also the full weights (LoRA: merged)
    lora_adapter/                       LoRA only, always: the PEFT adapter (adapter_config.json +
                                        adapter_model.safetensors); the model shards then hold only the
                                        trainable (adapter) entries, the frozen base comes from model.path
The HF config, tokenizer and shard meta are written on every save so that `python -m rlpost.model_merger` can
turn any checkpoint into a HF folder.
"""

from __future__ import annotations

import logging
import os
import random
from typing import Any, Iterable

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from rlpost.checkpoint.format import (
    CONTENTS,
    HF_SUBDIR,
    LORA_SUBDIR,
    build_fsdp_meta,
    rank_file,
    save_fsdp_meta,
)
from rlpost.engine.fsdp import iter_full_params, load_local_state, local_state, trainable_names
from rlpost.engine.lora import adapter_tensors, is_adapter_entry, merged_params, save_adapter

logger = logging.getLogger(__name__)


def _file(local_path: str, content: str) -> str:
    return str(rank_file(local_path, content, dist.get_world_size(), dist.get_rank()))


def _check_contents(contents: Iterable[str]) -> list[str]:
    contents = list(contents)
    bad = [c for c in contents if c not in CONTENTS]
    if bad:
        raise ValueError(f"checkpoint contents {bad} unknown; valid: {list(CONTENTS)}")
    return contents


def _optim_local(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Optimiser state_dict with every DTensor replaced by this rank's local shard (CPU copy)."""
    sd = optimizer.state_dict()
    state = {
        idx: {k: (v.to_local() if isinstance(v, DTensor) else v).detach().cpu().clone()
              if isinstance(v, torch.Tensor) else v for k, v in st.items()}
        for idx, st in sd["state"].items()
    }
    return {"state": state, "param_groups": sd["param_groups"]}


def _optim_restore(optimizer: torch.optim.Optimizer, saved: dict[str, Any]) -> None:
    """Load `_optim_local` output: local shards are re-wrapped as DTensors laid out like their params."""
    params = [p for g in optimizer.param_groups for p in g["params"]]
    state = {}
    for idx, st in saved["state"].items():
        p = params[int(idx)]
        new = {}
        for k, v in st.items():
            if isinstance(p, DTensor) and isinstance(v, torch.Tensor) and v.dim() > 0:
                local = v.to(p.to_local().device)
                v = DTensor.from_local(local, p.device_mesh, p.placements, shape=p.shape, stride=p.stride())
            new[k] = v
        state[idx] = new
    optimizer.load_state_dict({"state": state, "param_groups": saved["param_groups"]})


def _rng_state() -> dict[str, Any]:
    state = {"cpu": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["cpu"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def save_hf_model(model: torch.nn.Module, local_path: str, tokenizer: Any = None, lora: bool = False) -> None:
    """Gather full tensors one at a time (all ranks take part); rank 0 writes `local_path/huggingface`
    (a LoRA model's adapters folded into their base weights)."""
    out = os.path.join(local_path, HF_SUBDIR)
    full = {}
    named = iter_full_params(model)
    for name, tensor in (merged_params(model, named, None) if lora else named):
        if dist.get_rank() == 0:
            full[name] = tensor.detach().cpu()
    if dist.get_rank() == 0:
        model.save_pretrained(out, state_dict=full, safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(out)
    dist.barrier()


def save_hf_config(model: torch.nn.Module, local_path: str, tokenizer: Any = None) -> None:
    """Rank 0 writes the model's config (+ generation config) and the tokenizer to `local_path/huggingface`."""
    if dist.get_rank() != 0:
        return
    out = os.path.join(local_path, HF_SUBDIR)
    model.config.save_pretrained(out)
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(out)
    if tokenizer is not None:
        tokenizer.save_pretrained(out)


def save_lora_adapter(model: torch.nn.Module, peft_config: Any, local_path: str) -> None:
    """Gather the adapter (all ranks take part); rank 0 writes the PEFT folder `local_path/lora_adapter`."""
    tensors = adapter_tensors(iter_full_params(model, keep=is_adapter_entry))
    if dist.get_rank() == 0:
        save_adapter(os.path.join(local_path, LORA_SUBDIR), tensors, peft_config)


def save_fsdp_checkpoint(local_path: str, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None,
                         lr_scheduler: Any, contents: Iterable[str], tokenizer: Any = None,
                         peft_config: Any = None) -> None:
    """Write the chosen `contents` of this rank into `local_path` (every rank calls it). With `peft_config`
    (a LoRA model) the shards hold the trainable entries only, and the adapter is saved in PEFT's layout."""
    contents = _check_contents(contents)
    os.makedirs(local_path, exist_ok=True)
    lora = peft_config is not None
    if "model" in contents:
        keep = trainable_names(model) if lora else None
        torch.save(local_state(model, keep), _file(local_path, "model"))
        if dist.get_rank() == 0:  # shapes and placements are the same on every rank: no gather
            _save_meta(model, local_path, keep)
    if lora:
        save_lora_adapter(model, peft_config, local_path)
    if "optimizer" in contents and optimizer is not None:
        torch.save(_optim_local(optimizer), _file(local_path, "optimizer"))
    if "extra" in contents:
        extra = {"rng": _rng_state(), "lr_scheduler": lr_scheduler.state_dict() if lr_scheduler else None}
        torch.save(extra, _file(local_path, "extra"))
    if "hf_model" in contents:
        save_hf_model(model, local_path, tokenizer, lora)
    else:
        save_hf_config(model, local_path, tokenizer)
    dist.barrier()


def _save_meta(model: torch.nn.Module, local_path: str, keep: set[str] | None) -> None:
    """`fsdp_meta.json` of the saved model shards: each entry's full shape, placement and dtype, and the model's
    transformers class (FSDP2 wraps it in a generated `FSDP<name>` subclass). A layout the meta cannot describe
    (a 2-D mesh) is left without one: the merger then says it cannot merge it."""
    import transformers

    state = {n: t for n, t in model.state_dict().items() if keep is None or n in keep}
    name = next(c.__name__ for c in type(model).__mro__ if not c.__name__.startswith("FSDP"))
    try:
        meta = build_fsdp_meta(state, dist.get_world_size(), name if hasattr(transformers, name) else None)
    except ValueError as err:
        logger.warning("%s: no %s written (%s)", local_path, "fsdp_meta.json", err)
        return
    save_fsdp_meta(local_path, meta)


def _configured_lrs(optimizer: torch.optim.Optimizer | None) -> list[float]:
    """Each param group's learning rate as this run configured it (the schedule's base, before any step)."""
    if optimizer is None:
        return []
    return [float(g.get("initial_lr", g["lr"])) for g in optimizer.param_groups]


def _keep_configured_lrs(optimizer: torch.optim.Optimizer, lr_scheduler: Any, configured: list[float]) -> list[str]:
    """After a restore: put back the configured base learning rates where the checkpoint's differ (a resumed run
    trains at the rate it is given, not the saved one), the schedule's position kept. Returns one note per
    changed group."""
    notes = []
    saved = [float(b) for b in getattr(lr_scheduler, "base_lrs", None) or _configured_lrs(optimizer)]
    for i, (group, want, had) in enumerate(zip(optimizer.param_groups, configured, saved)):
        if abs(want - had) <= 1e-12 * max(abs(want), abs(had)):
            continue
        group["initial_lr"] = want
        if lr_scheduler is not None:
            lr_scheduler.base_lrs[i] = want
            lambdas = getattr(lr_scheduler, "lr_lambdas", None)
            group["lr"] = want * lambdas[i](lr_scheduler.last_epoch) if lambdas else want
        else:
            group["lr"] = want
        notes.append(f"learning rate {want:g} (the checkpoint's was {had:g})")
    return notes


def load_fsdp_checkpoint(local_path: str, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None,
                         lr_scheduler: Any, contents: Iterable[str], lora: bool = False) -> list[str]:
    """Restore what `save_fsdp_checkpoint` wrote (same world size); missing files raise FileNotFoundError.
    `lora`: the shards hold the trainable entries only. The configured learning rate wins over the saved one.

    Returns:
        notes on values this run keeps from its own config instead of the checkpoint (e.g. a changed LR).
    """
    configured = _configured_lrs(optimizer)
    contents = [c for c in _check_contents(contents) if c != "hf_model"]
    if "model" in contents:
        load_local_state(model, torch.load(_file(local_path, "model"), weights_only=False),
                         trainable_names(model) if lora else None)
    if "optimizer" in contents and optimizer is not None:
        _optim_restore(optimizer, torch.load(_file(local_path, "optimizer"), weights_only=False))
    if "extra" in contents:
        extra = torch.load(_file(local_path, "extra"), weights_only=False)
        _set_rng_state(extra["rng"])
        if lr_scheduler is not None and extra["lr_scheduler"] is not None:
            lr_scheduler.load_state_dict(extra["lr_scheduler"])
    notes = _keep_configured_lrs(optimizer, lr_scheduler, configured) if optimizer is not None else []
    dist.barrier()
    return notes
