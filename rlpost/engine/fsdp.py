"""FSDP2 (`torch.distributed.fsdp.fully_shard`), applied from outside the model. The only module that shards.

Takes plain values, not a config group: each worker reads its own `fsdp_config` (fsdp_size,
reshard_after_forward, offload_policy, wrap_policy.min_num_params) and passes them in. strategy `fsdp`
and `fsdp2` both run this one FSDP2 implementation.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from rlpost.engine.fsdp_gather import full_entry, iter_full_bucketed
from rlpost.utils.model import decoder_layer_classes

_DTYPES = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
           "fp16": torch.float16, "float16": torch.float16}


def to_dtype(name: Any) -> torch.dtype:
    """'bf16' / 'float32' / torch.dtype -> torch.dtype."""
    if isinstance(name, torch.dtype):
        return name
    if str(name) not in _DTYPES:
        raise ValueError(f"unknown dtype {name!r}; valid: {sorted(_DTYPES)}")
    return _DTYPES[str(name)]


def compute_dtype(device: str, param_dtype: Any = None) -> torch.dtype:
    """Dtype the sharded params compute in (FSDP2 mixed precision): `param_dtype`
    (`fsdp_config.mixed_precision.param_dtype`) when set, else bfloat16 on CUDA and float32 on CPU, where
    bf16 matmuls are slow. Master weights of trained models stay float32 (`fsdp_config.model_dtype: fp32`)."""
    if param_dtype is not None:
        return to_dtype(param_dtype)
    return torch.float32 if device == "cpu" else torch.bfloat16


def build_device_mesh(device: str, fsdp_size: int) -> DeviceMesh:
    """1-D mesh ("fsdp",) over all ranks, or 2-D ("ddp", "fsdp") for HSDP when 0 < fsdp_size < world."""
    world = dist.get_world_size()
    if fsdp_size <= 0 or fsdp_size >= world:
        return init_device_mesh(device, (world,), mesh_dim_names=("fsdp",))
    if world % fsdp_size != 0:
        raise ValueError(f"fsdp_config.fsdp_size={fsdp_size} must divide world size {world}")
    return init_device_mesh(device, (world // fsdp_size, fsdp_size), mesh_dim_names=("ddp", "fsdp"))


def _is_container(mod: torch.nn.Module) -> bool:
    """A ModuleList / ModuleDict without a forward of its own: fully_shard refuses it (nothing to hook)."""
    return isinstance(mod, (torch.nn.ModuleList, torch.nn.ModuleDict)) and type(mod).forward is torch.nn.Module.forward


def _size_wrapped(model: torch.nn.Module, min_params: int, skip: set[int]) -> list[torch.nn.Module]:
    """Submodules (post-order) whose not-yet-wrapped parameter count reaches `min_params`; a container without
    forward (the decoder's layer list) is never a unit: its count passes on to its parent."""
    chosen: list[torch.nn.Module] = []

    def visit(mod: torch.nn.Module) -> int:
        remaining = sum(visit(c) for c in mod.children())
        remaining += sum(p.numel() for p in mod.parameters(recurse=False))
        if mod is not model and id(mod) not in skip and not _is_container(mod) and remaining >= min_params:
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
        tied = {id(model.get_input_embeddings()), id(model.get_output_embeddings())}
        # nor a module holding one of them (the decoder stack's parent holds the input embeddings)
        skip = {id(m) for m in model.modules() if any(id(sub) in tied for sub in m.modules())}
    if min_num_params > 0:
        units = _size_wrapped(model, min_num_params, skip)
    else:
        classes = decoder_layer_classes(model)
        units = [m for m in model.modules() if classes and isinstance(m, classes)]
    return units + [model]


def apply_fsdp2(model: torch.nn.Module, device: str, *, fsdp_size: int, reshard_after_forward: bool,
                offload_policy: bool, min_num_params: int, mesh: DeviceMesh | None = None,
                trainable: bool = True, param_dtype: Any = None, forward_prefetch: bool = False) -> torch.nn.Module:
    """Shard `model` in place with FSDP2 and move it to `device`.

    Args:
        model: on CPU. device: "cpu" or "cuda".
        fsdp_size: devices per sharding group (`build_device_mesh`). reshard_after_forward: free gathered
            params after forward. offload_policy: keep params/grads/optimizer state on CPU (CPUOffloadPolicy).
        min_num_params: size-based wrapping unit (`units_to_wrap`); 0: one unit per decoder layer.
        trainable: False freezes the parameters (reference, reward model).
        param_dtype: compute dtype override (`fsdp_config.mixed_precision.param_dtype`); None: by device.
        forward_prefetch: each unit starts the all-gather of the next unit when its own forward starts
            (`set_modules_to_forward_prefetch`), instead of when the next unit's forward starts.

    Mixed precision: params compute in `compute_dtype(device, param_dtype)`, gradients reduce in float32.
    """
    mesh = mesh or build_device_mesh(device, int(fsdp_size))
    mp = MixedPrecisionPolicy(param_dtype=compute_dtype(device, param_dtype), reduce_dtype=torch.float32,
                              cast_forward_inputs=True)
    kwargs: dict[str, Any] = {"mesh": mesh, "mp_policy": mp, "reshard_after_forward": bool(reshard_after_forward)}
    if offload_policy:
        kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=device != "cpu")
    units = units_to_wrap(model, int(min_num_params))
    for unit in units:
        fully_shard(unit, **kwargs)
    if forward_prefetch:
        set_forward_prefetch(units)
    if any(p.is_meta for p in model.parameters()):  # built empty: storage now, values from rank 0
        model.to_empty(device=device)  # (`load_for_sharding` never builds empty under an offload policy)
    elif "offload_policy" not in kwargs:
        model.to(device)
    if not trainable:
        model.requires_grad_(False)
    return model


def load_shards_from_rank0(model: torch.nn.Module, full_state: dict[str, torch.Tensor] | None) -> None:
    """Fill a sharded model's parameters (and buffers) from rank 0's full state dict: every rank calls it,
    rank 0 with the state dict of the model it loaded (taken before sharding), the others with None (their
    model was built empty and materialised by `apply_fsdp2`). Non-persistent buffers (rotary frequencies)
    are not in a state dict: they are broadcast from rank 0 as they are."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    set_model_state_dict(model, full_state or {},
                         options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    for buf in model.buffers():  # on the model's device (`init_distributed` gives CPU tensors gloo on a GPU host)
        dist.broadcast(buf.to_local() if isinstance(buf, DTensor) else buf, src=0)
    left = [name for name, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if left:
        raise RuntimeError(f"rank {dist.get_rank()}: {len(left)} tensors are still on the meta device after the "
                           f"load from rank 0 (first: {left[0]}); the model keeps state outside its parameters "
                           "and buffers, which only a full load gives it")


def set_forward_prefetch(units: list[torch.nn.Module]) -> None:
    """Root, then each wrapped unit in module order, prefetches the next unit's all-gather in forward.

    FSDP2 otherwise issues a unit's all-gather from its own pre-forward hook, so the copy can only overlap
    the previous unit's compute if the CPU runs ahead; an explicit prefetch queues it one unit earlier.
    (Backward prefetch is FSDP2's default.)

    Args:
        units: as from `units_to_wrap`, already `fully_shard`-ed: blocks in module order, root last.
    """
    *blocks, root = units
    if blocks:
        root.set_modules_to_forward_prefetch([blocks[0]])
    for unit, nxt in zip(blocks, blocks[1:]):
        unit.set_modules_to_forward_prefetch([nxt])


def reshard(model: torch.nn.Module) -> None:
    """Free every FSDP unit's gathered parameters (a no-op for units already sharded).

    With `reshard_after_forward=false` a forward without backward (old_log_prob, ref) leaves the units'
    parameters gathered, so later micro-batches of the same pass skip the all-gathers; the end of each
    phase calls this, so the gathered copy never outlives the pass (into generation, an offload or a sync)."""
    for unit in model.modules():
        if isinstance(unit, FSDPModule):
            unit.reshard()


def offload_model(model: torch.nn.Module) -> None:
    """Move the sharded params (and grads) to CPU between phases (param_offload without offload_policy).

    From a GPU each copy is non-blocking, so it lands in pinned host memory (PyTorch's caching host
    allocator keeps those blocks for the next offload): no fresh pageable memory is faulted in on every
    offload, and `load_model_to` copies back at full link speed. Each copy is waited for before the next
    tensor (FSDP re-pads unevenly sharded params on the host right after the moves). The price: that allocator
    rounds each block up to a power of two and keeps it, so up to ~2x the shard stays pinned in host memory."""
    if not any(p.is_cuda for p in model.parameters()):
        model.to("cpu")
        return

    def to_pinned_host(t: torch.Tensor) -> torch.Tensor:
        if not t.is_cuda:
            return t.to("cpu")
        out = t.to("cpu", non_blocking=True)
        torch.cuda.current_stream(t.device).synchronize()
        return out

    model._apply(to_pinned_host)


def load_model_to(model: torch.nn.Module, device: str) -> None:
    """Bring the sharded params back to `device` before a forward/backward (non-blocking from the pinned
    host copies `offload_model` made; kernels that follow on the stream wait for them)."""
    model.to(device, non_blocking=device != "cpu")


def move_optimizer(optimizer: torch.optim.Optimizer, device: str) -> None:
    """Move AdamW state tensors (optimizer_offload) to `device` ('cpu' to offload)."""
    for state in optimizer.state.values():
        for key, val in state.items():
            if isinstance(val, torch.Tensor) and key != "step":
                state[key] = val.to(device, non_blocking=True)


def iter_full_params(model: torch.nn.Module, dtype: torch.dtype | None = None,
                     keep: Callable[[str], bool] | None = None,
                     bucket_bytes: int = 0) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (hf_name, full tensor) in state-dict order; every rank must consume the whole iterator.

    `bucket_bytes` 0: one all-gather per tensor, and only one gathered tensor is alive at a time (the caller
    drops it before the next), so the peak is one layer's weight. `bucket_bytes` > 0: one all-gather per
    bucket of that many bytes of full tensors (`rlpost.engine.fsdp_gather`): fewer collectives, about two
    buckets of extra memory; the same values. `keep(name)` False skips an entry before its gather (e.g. the
    frozen base when only LoRA adapters are wanted).
    """
    entries = ((n, t) for n, t in model.state_dict().items() if keep is None or keep(n))
    if bucket_bytes > 0:
        yield from iter_full_bucketed(entries, dtype, bucket_bytes)
        return
    for name, tensor in entries:
        yield name, full_entry(tensor, dtype)


def trainable_names(model: torch.nn.Module) -> set[str]:
    """State-dict names of the parameters that train (a LoRA model: its adapters, not the frozen base)."""
    return {name for name, p in model.named_parameters() if p.requires_grad}


def local_state(model: torch.nn.Module, only: set[str] | None = None) -> dict[str, torch.Tensor]:
    """This rank's shard of every state-dict entry (or of the names in `only`), as CPU copies, for per-rank
    checkpoints."""
    out = {}
    for name, tensor in model.state_dict().items():
        if only is not None and name not in only:
            continue
        local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
        out[name] = local.detach().to("cpu", copy=True)
    return out


@torch.no_grad()
def load_local_state(model: torch.nn.Module, shards: dict[str, torch.Tensor], only: set[str] | None = None) -> None:
    """Copy per-rank shards saved by `local_state` back into the sharded params (same world size); with
    `only`, just those entries (the rest keeps what the model loaded)."""
    current = {k: v for k, v in model.state_dict().items() if only is None or k in only}
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
