"""Liger-Kernel's Triton kernels on a HF model instance (`actor_rollout_ref.model.use_liger`, and the SFT
trainer's `model.use_liger`).

Liger swaps the forwards of the model's RMSNorm and MLP modules for its own (RMSNorm, SwiGLU) and, for the
model's family, module-level names of the transformers modelling file (`apply_rotary_pos_emb`, the norm
and MLP classes): every model of that family built later in the same process uses them too.

Liger's fused linear cross-entropy stays off: it replaces the causal LM's `forward`, while rlpost reads
log-probs from the logits, or from its own chunked LM head with `model.use_fused_kernels`
(`rlpost.engine.fused_logprob`), which swaps the head of an unchanged forward.

The kernels are Triton: they run on a CUDA GPU only. The start-up check
(`rlpost.trainer.config.rules.check_liger_run`) refuses a CPU run, a missing package and a model type Liger
does not patch before any worker starts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the start-up check imports this module; it needs no torch
    import torch

# The release installed by `pip install 'rlpost[liger]'` (a py3-none-any wheel; needs torch and triton only).
LIGER_REQUIREMENT = "liger-kernel==0.8.5"


def liger_model_types() -> tuple[str, ...]:
    """The HF `model_type`s Liger patches (its own table), sorted. Raises ImportError without liger_kernel."""
    from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN

    return tuple(sorted(MODEL_TYPE_TO_APPLY_LIGER_FN))


def apply_liger(model: torch.nn.Module, key: str = "actor_rollout_ref.model.use_liger") -> None:
    """Patch `model` (a HF causal LM, before FSDP wrapping) in place with Liger's RoPE, RMSNorm and SwiGLU.

    Args:
        model: The loaded model.
        key: The config key that turned Liger on, named in the error.

    Raises:
        ValueError: the model's `config.model_type` is not one Liger patches (Liger itself would only log it
            and leave the model as it is).
    """
    from liger_kernel.transformers.monkey_patch import _apply_liger_kernel_to_instance

    model_type = model.config.model_type
    supported = liger_model_types()
    if model_type not in supported:
        raise ValueError(f"{key}=true: Liger has no kernels for model_type={model_type} "
                         f"(it patches {', '.join(supported)}); use {key}=false.")
    _apply_liger_kernel_to_instance(model=model, fused_linear_cross_entropy=False)
