"""Activation offload (`model.enable_activation_offload`): tensors saved for backward wait on the CPU.

The same mechanism as `torch.autograd.graph.save_on_cpu` (saved-tensor hooks: copy to pinned host memory
when autograd saves a tensor, copy back when backward needs it), with one difference that matters under
FSDP2: parameters are not offloaded. Autograd saves the weight of every matmul, and under FSDP2 that is the
unsharded (all-gathered) parameter; `save_on_cpu` would copy every gathered layer to the host on each
forward. Leaves (parameters, inputs) and views of leaves stay where they are: they are alive anyway, so
moving them would save nothing.

With gradient checkpointing the checkpointed layers keep only their inputs (non-reentrant checkpointing
installs its own hooks inside each layer, which take precedence there); what is offloaded then is what
autograd saves outside those layers (embeddings, final norm, LM head input, the log-prob chunks' inputs).
"""

from __future__ import annotations

from typing import Any

import torch


def _is_param_like(t: torch.Tensor) -> bool:
    """Leaves (parameters, inputs) and views of leaves (a weight's transpose)."""
    return t.is_leaf or (t._base is not None and t._base.is_leaf)


class ActivationOffload:
    """Saved-tensor hooks active during the forward of one module (installed by `enable_activation_offload`).

    Attributes:
        offloaded_bytes: bytes copied to the host since creation (tests and logging read it).
    """

    def __init__(self, pin_memory: bool) -> None:
        self.pin_memory = pin_memory
        self.offloaded_bytes = 0
        self._active: list[Any] = []

    def pack(self, t: torch.Tensor) -> Any:
        if _is_param_like(t):
            return t
        host = torch.empty(t.size(), dtype=t.dtype, layout=t.layout, pin_memory=self.pin_memory)
        # Stream-ordered: the device block may be reused only by kernels queued after this copy.
        host.copy_(t, non_blocking=self.pin_memory)
        self.offloaded_bytes += t.numel() * t.element_size()
        return t.device, host

    def unpack(self, packed: Any) -> torch.Tensor:
        if isinstance(packed, torch.Tensor):
            return packed
        device, host = packed
        return host.to(device, non_blocking=self.pin_memory)

    def enter(self, *_: Any) -> None:
        """Forward pre-hook: start offloading (only when autograd records; no-grad passes save nothing)."""
        hooks = torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack) if torch.is_grad_enabled() else None
        if hooks is not None:
            hooks.__enter__()
        self._active.append(hooks)

    def exit(self, *_: Any) -> None:
        """Forward hook (also on an exception): stop offloading."""
        hooks = self._active.pop()
        if hooks is not None:
            hooks.__exit__(None, None, None)


def enable_activation_offload(module: torch.nn.Module, device: str) -> ActivationOffload:
    """Offload what autograd saves during `module`'s forward to (pinned, on CUDA) host memory.

    Args:
        module: the root model (FSDP2-wrapped or not). device: "cuda" pins the host buffers; "cpu" copies
            (no memory saved there; the path is the same, which is what the CPU tests check).

    Returns:
        the installed hooks (its `offloaded_bytes` counts what moved).
    """
    offload = ActivationOffload(pin_memory=device != "cpu")
    module.register_forward_pre_hook(offload.enter)
    module.register_forward_hook(offload.exit, always_call=True)
    return offload
