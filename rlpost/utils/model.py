"""HF model loading for the workers: causal LM (actor / ref) and a value model (critic).

Config keys read (verl's `actor_rollout_ref.model` / `critic.model`): path, trust_remote_code, override_config,
external_lib / external_libs, enable_gradient_checkpointing, and the kernel options that are not built yet
(use_liger, use_fused_kernels, enable_activation_offload, use_shm), which raise when switched on.
"""

from __future__ import annotations

import importlib
from typing import Any

import torch
from omegaconf import OmegaConf

# Model options in scope but not built: each raises "not supported yet" when set away from its default.
UNSUPPORTED_MODEL_FLAGS = ("use_liger", "use_fused_kernels", "enable_activation_offload", "use_shm")


def _get(cfg: Any, key: str, default: Any = None) -> Any:
    if cfg is None:
        return default
    val = cfg.get(key, default) if hasattr(cfg, "get") else getattr(cfg, key, default)
    return default if val is None else val


def check_model_options(model_cfg: Any, prefix: str = "model") -> None:
    """Raise `NotImplementedError` naming the key for any unbuilt model option that is switched on."""
    for key in UNSUPPORTED_MODEL_FLAGS:
        if _get(model_cfg, key, False):
            raise NotImplementedError(f"not supported yet: {prefix}.{key}={_get(model_cfg, key)} (default False)")


def import_external_libs(model_cfg: Any) -> None:
    """Import `external_lib` (str) and `external_libs` (str or list) so they can register custom models."""
    names: list[str] = []
    for key in ("external_lib", "external_libs"):
        val = _get(model_cfg, key)
        if isinstance(val, str):
            names.append(val)
        elif val is not None:
            names.extend(str(v) for v in val)
    for name in names:
        importlib.import_module(name)


def _to_plain(obj: Any) -> Any:
    """DictConfig/ListConfig -> plain python containers (dicts pass through)."""
    return OmegaConf.to_container(obj, resolve=True) if OmegaConf.is_config(obj) else obj


def load_hf_config(model_cfg: Any, path: str | None = None):
    """AutoConfig of `model.path` with `override_config` applied (nested `model_config` dict flattened in)."""
    from transformers import AutoConfig

    path = path or _get(model_cfg, "path")
    trust = bool(_get(model_cfg, "trust_remote_code", False))
    hf_config = AutoConfig.from_pretrained(path, trust_remote_code=trust)
    overrides = dict(_to_plain(_get(model_cfg, "override_config", {})) or {})
    overrides.update(overrides.pop("model_config", None) or {})
    for key, val in overrides.items():
        setattr(hf_config, key, val)
    return hf_config


def load_model(
    model_cfg: Any, dtype: torch.dtype, value_model: bool = False, path: str | None = None
) -> torch.nn.Module:
    """Load the HF model of `model.path` on CPU in `dtype`, SDPA attention.

    Args:
        model_cfg: the `model` config group.
        dtype: dtype of the loaded weights (float32 master weights for trainable models).
        value_model: load `AutoModelForTokenClassification` with one label (a value head on the backbone)
            instead of a causal LM; the head is freshly initialised when the checkpoint has none.
        path: overrides `model_cfg.path` (critic.model.path).

    Returns:
        the model, in train mode, gradient checkpointing enabled when `enable_gradient_checkpointing`.
    """
    from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

    check_model_options(model_cfg)
    import_external_libs(model_cfg)
    path = path or _get(model_cfg, "path")
    hf_config = load_hf_config(model_cfg, path)
    trust = bool(_get(model_cfg, "trust_remote_code", False))
    if value_model:
        hf_config.num_labels = 1
        hf_config.classifier_dropout = 0.0
        cls = AutoModelForTokenClassification
    else:
        cls = AutoModelForCausalLM
    model = cls.from_pretrained(
        path, config=hf_config, dtype=dtype, trust_remote_code=trust, attn_implementation="sdpa"
    )
    if _get(model_cfg, "enable_gradient_checkpointing", False):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


def decoder_layer_classes(model: torch.nn.Module) -> tuple[type, ...]:
    """Classes of the transformer blocks (from HF `_no_split_modules`), the FSDP2 wrapping unit."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    classes = {type(m) for m in model.modules() if type(m).__name__ in names}
    return tuple(classes)
