"""HF model loading for the workers: causal LM (actor / ref) and a value model (critic).

Config keys read (verl's `actor_rollout_ref.model` / `critic.model`): path, use_shm, trust_remote_code,
override_config, external_lib, enable_gradient_checkpointing, use_remove_padding (packed attention,
`rlpost.utils.packed_attention`), use_liger (causal LMs only: Liger's kernels, `rlpost.utils.liger`).
Options that are not built are refused at start-up (`rlpost/trainer/config/unsupported.py`), not here.
"""

from __future__ import annotations

import importlib
from typing import Any

import torch
from omegaconf import OmegaConf

from rlpost.utils.liger import apply_liger
from rlpost.utils.packed_attention import use_packed_attention
from rlpost.utils.shm import local_model_path


def import_external_libs(names: str | list[str] | None) -> None:
    """Import the module(s) of `model.external_lib` (a name, a list, or None) so they can register custom
    models with HF's auto classes."""
    if names is None:
        return
    for name in [names] if isinstance(names, str) else list(names):
        importlib.import_module(str(name))


def _to_plain(obj: Any) -> Any:
    """DictConfig/ListConfig -> plain python containers (dicts pass through)."""
    return OmegaConf.to_container(obj, resolve=True) if OmegaConf.is_config(obj) else obj


def load_hf_config(path: str, trust_remote_code: bool, override_config: Any):
    """AutoConfig of `path` with `override_config` applied (its nested `model_config` mapping flattened in)."""
    from transformers import AutoConfig

    hf_config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    overrides = dict(_to_plain(override_config))
    overrides.update(overrides.pop("model_config", None) or {})
    for key, val in overrides.items():
        setattr(hf_config, key, val)
    return hf_config


def load_model(model_cfg: Any, dtype: torch.dtype, value_model: bool = False) -> torch.nn.Module:
    """Load the HF model of `model.path` on CPU in `dtype`, SDPA attention.

    Args:
        model_cfg: the `actor_rollout_ref.model` or `critic.model` group.
        dtype: dtype of the loaded weights (float32 master weights for trainable models).
        value_model: load `AutoModelForTokenClassification` with one label (a value head on the backbone)
            instead of a causal LM; the head is freshly initialised when the checkpoint has none.

    Returns:
        the model, in train mode, Liger's RMSNorm / RoPE / SwiGLU kernels in it when `use_liger` (causal LM),
        gradient checkpointing enabled when `enable_gradient_checkpointing`, its attention on packed rows
        without a mask when `use_remove_padding`.
    """
    from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

    import_external_libs(model_cfg.external_lib)
    trust = bool(model_cfg.trust_remote_code)
    path = local_model_path(model_cfg)
    hf_config = load_hf_config(path, trust, model_cfg.override_config)
    if value_model:
        hf_config.num_labels = 1
        hf_config.classifier_dropout = 0.0
        cls = AutoModelForTokenClassification
    else:
        cls = AutoModelForCausalLM
    model = cls.from_pretrained(
        path, config=hf_config, dtype=dtype, trust_remote_code=trust, attn_implementation="sdpa"
    )
    if not value_model and model_cfg.use_liger:  # the critic's model group has no use_liger (nor has verl's)
        apply_liger(model)
    if model_cfg.enable_gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if model_cfg.use_remove_padding:
        use_packed_attention(model)
    return model


def decoder_layer_classes(model: torch.nn.Module) -> tuple[type, ...]:
    """Classes of the transformer blocks (from HF `_no_split_modules`), the FSDP2 wrapping unit."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    classes = {type(m) for m in model.modules() if type(m).__name__ in names}
    return tuple(classes)
