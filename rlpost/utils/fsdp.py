"""FSDP2 (`torch.distributed.fsdp.fully_shard`), applied from outside the model. The only module that shards.

Config keys read (verl's `fsdp_config` group): fsdp_size, param_offload, optimizer_offload, offload_policy,
reshard_after_forward, wrap_policy.min_num_params, and optionally model_dtype / mixed_precision.{param_dtype,
reduce_dtype}. strategy `fsdp` takes the same FSDP2 path as `fsdp2` (there is one implementation).
"""

from __future__ import annotations

from typing import Any, Iterator

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from rlpost.utils.model import decoder_layer_classes

STRATEGIES = ("fsdp", "fsdp2")
_DTYPES = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
           "fp16": torch.float16, "float16": torch.float16}


def _get(cfg: Any, key: str, default: Any = None) -> Any:
    if cfg is None:
        return default
    val = cfg.get(key, default) if hasattr(cfg, "get") else getattr(cfg, key, default)
    return default if val is None else val


def check_strategy(strategy: str, prefix: str) -> None:
    """Accept `fsdp` and `fsdp2` (`fsdp` takes the same FSDP2 path; there is no FSDP1 code); else raise."""
    if strategy not in STRATEGIES:
        raise NotImplementedError(f"not supported yet: {prefix}.strategy={strategy!r}; use 'fsdp2'")
    # forward_prefetch is an FSDP1 knob; FSDP2 prefetches the next layer's all-gather by itself.


def to_dtype(name: Any) -> torch.dtype:
    """'bf16' / 'float32' / torch.dtype -> torch.dtype."""
    if isinstance(name, torch.dtype):
        return name
    if str(name) not in _DTYPES:
        raise ValueError(f"unknown dtype {name!r}; valid: {sorted(_DTYPES)}")
    return _DTYPES[str(name)]


def param_dtype(fsdp_cfg: Any, device: str) -> torch.dtype:
    """Compute dtype of the sharded params: `model_dtype` or `mixed_precision.param_dtype` if set, else
    float32 on CPU (bf16 matmuls are slow there) and bfloat16 on CUDA."""
    name = _get(fsdp_cfg, "model_dtype") or _get(_get(fsdp_cfg, "mixed_precision"), "param_dtype")
    if name is not None:
        return to_dtype(name)
    return torch.float32 if device == "cpu" else torch.bfloat16


def build_device_mesh(device: str, fsdp_size: int = -1) -> DeviceMesh:
    """1-D mesh ("fsdp",) over all ranks, or 2-D ("ddp", "fsdp") for HSDP when 0 < fsdp_size < world."""
    world = dist.get_world_size()
    if fsdp_size <= 0 or fsdp_size >= world:
        return init_device_mesh(device, (world,), mesh_dim_names=("fsdp",))
    if world % fsdp_size != 0:
        raise ValueError(f"fsdp_config.fsdp_size={fsdp_size} must divide world size {world}")
    return init_device_mesh(device, (world // fsdp_size, fsdp_size), mesh_dim_names=("ddp", "fsdp"))


def _size_wrapped(model: torch.nn.Module, min_params: int, skip: set[int]) -> list[torch.nn.Module]:
    """Submodules (post-order) whose not-yet-wrapped parameter count reaches `min_params`."""
    chosen: list[torch.nn.Module] = []

    def visit(mod: torch.nn.Module) -> int:
        remaining = sum(visit(c) for c in mod.children())
        remaining += sum(p.numel() for p in mod.parameters(recurse=False))
        if mod is not model and id(mod) not in skip and remaining >= min_params:
            chosen.append(mod)
            return 0
        return remaining

    visit(model)
    return chosen


def units_to_wrap(model: torch.nn.Module, min_num_params: int = 0) -> list[torch.nn.Module]:
    """Decoder layers (or size-based units when `min_num_params` > 0), children before parents, root last.

    Tied input/output embeddings are never wrapped on their own: both must live in the root's group.
    """
    skip = set()
    if getattr(getattr(model, "config", None), "tie_word_embeddings", False):
        skip = {id(model.get_input_embeddings()), id(model.get_output_embeddings())}
    if min_num_params > 0:
        units = _size_wrapped(model, min_num_params, skip)
    else:
        classes = decoder_layer_classes(model)
        units = [m for m in model.modules() if classes and isinstance(m, classes)]
    return units + [model]


def apply_fsdp2(model: torch.nn.Module, fsdp_cfg: Any, device: str, mesh: DeviceMesh | None = None,
                trainable: bool = True) -> torch.nn.Module:
    """Shard `model` in place with FSDP2 and move it to `device`.

    Mixed precision: params compute in `param_dtype(fsdp_cfg, device)`, gradients reduce in float32.
    offload_policy=True keeps params/grads/optimizer on CPU (CPUOffloadPolicy). The model must be on CPU.
    """
    mesh = mesh or build_device_mesh(device, int(_get(fsdp_cfg, "fsdp_size", -1)))
    mp = MixedPrecisionPolicy(param_dtype=param_dtype(fsdp_cfg, device), reduce_dtype=torch.float32,
                              cast_forward_inputs=True)
    kwargs: dict[str, Any] = {"mesh": mesh, "mp_policy": mp,
                              "reshard_after_forward": bool(_get(fsdp_cfg, "reshard_after_forward", True))}
    if _get(fsdp_cfg, "offload_policy", False):
        kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=device != "cpu")
    min_params = int(_get(_get(fsdp_cfg, "wrap_policy"), "min_num_params", 0))
    for unit in units_to_wrap(model, min_params):
        fully_shard(unit, **kwargs)
    if "offload_policy" not in kwargs:
        model.to(device)
    if not trainable:
        model.requires_grad_(False)
    return model


def offload_model(model: torch.nn.Module) -> None:
    """Move the sharded params (and grads) to CPU between phases (param_offload without offload_policy)."""
    model.to("cpu")


def load_model_to(model: torch.nn.Module, device: str) -> None:
    """Bring the sharded params back to `device` before a forward/backward."""
    model.to(device)


def move_optimizer(optimizer: torch.optim.Optimizer, device: str) -> None:
    """Move AdamW state tensors (optimizer_offload) to `device` ('cpu' to offload)."""
    for state in optimizer.state.values():
        for key, val in state.items():
            if isinstance(val, torch.Tensor) and key != "step":
                state[key] = val.to(device, non_blocking=True)


def iter_full_params(model: torch.nn.Module, dtype: torch.dtype | None = None
                     ) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (hf_name, full tensor) one parameter at a time; every rank must consume the whole iterator.

    Only one gathered tensor is alive at a time (the caller drops it before the next), so the peak is one
    layer's weight, never a second full copy of the model.
    """
    for name, tensor in model.state_dict().items():
        if isinstance(tensor, DTensor) and tensor.device_mesh.size() == 1:
            tensor = tensor.to_local()  # one shard holds everything: no collective, no DTensor dispatch
        if dtype is not None:
            tensor = tensor.to(dtype)  # cast the shard before gathering: fp32 -> bf16 halves the bytes sent
        if isinstance(tensor, DTensor):
            tensor = tensor.full_tensor()
        yield name, tensor


def local_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """This rank's shard of every state-dict entry (plain tensors, CPU copies) for per-rank checkpoints."""
    out = {}
    for name, tensor in model.state_dict().items():
        local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
        out[name] = local.detach().to("cpu", copy=True)
    return out


@torch.no_grad()
def load_local_state(model: torch.nn.Module, shards: dict[str, torch.Tensor]) -> None:
    """Copy per-rank shards saved by `local_state` back into the sharded params (same world size)."""
    current = model.state_dict()
    missing = set(current) - set(shards)
    if missing:
        raise KeyError(f"checkpoint lacks {sorted(missing)[:5]}")
    for name, tensor in current.items():
        local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
        local.copy_(shards[name].to(local.device, local.dtype))


def clip_grad_norm(model: torch.nn.Module, max_norm: float) -> torch.Tensor:
    """Clip gradients of a (FSDP2) model; returns the total norm as a plain tensor (full, all ranks)."""
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=max_norm)
    return norm.full_tensor() if isinstance(norm, DTensor) else norm
