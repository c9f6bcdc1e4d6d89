"""HF model loading for the workers: causal LM (actor / ref) and a value model (critic).

Config keys read (verl's `actor_rollout_ref.model` / `critic.model`): path, use_shm, trust_remote_code,
override_config, external_lib, enable_gradient_checkpointing, use_remove_padding (packed attention,
`rlpost.engine.packed_attention`), use_liger (causal LMs only: Liger's kernels, `rlpost.engine.liger`).
Options that are not built are refused at start-up (`rlpost/trainer/config/unsupported.py`), not here.
With several ranks and untied embeddings only rank 0 reads the weights (`load_for_sharding`).
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import torch
from omegaconf import OmegaConf

from rlpost.utils.import_utils import import_external_libs
from rlpost.engine.liger import apply_liger
from rlpost.utils.lora_config import lora_enabled
from rlpost.utils.model_traits import model_traits
from rlpost.engine.packed_attention import use_packed_attention
from rlpost.utils.shm import local_model_path

logger = logging.getLogger(__name__)


def compute_position_id_with_mask(mask: torch.Tensor) -> torch.Tensor:
    """Position ids of left-padded rows: 0, 1, ... over the real tokens (`mask` 1), 0 on the padding before
    them. mask: (B, T) -> (B, T) long."""
    return torch.clamp(torch.cumsum(mask.long(), dim=-1) - 1, min=0)


def update_model_config(module_config: Any, override_config_kwargs: dict[str, Any]) -> None:
    """Set each override on `module_config` (a HF config) in place; a dict value recurses into the attribute of
    that name (e.g. {"text_config": {"hidden_size": 64}})."""
    for key, val in override_config_kwargs.items():
        if isinstance(val, dict):
            if not hasattr(module_config, key):
                raise AttributeError(f"update_model_config: {type(module_config).__name__} has no {key!r} to update "
                                     f"with {val!r}")
            update_model_config(getattr(module_config, key), val)
        else:
            setattr(module_config, key, val)


def create_random_mask(input_ids: torch.Tensor, max_ratio_of_valid_token: float, max_ratio_of_left_padding: float,
                       min_ratio_of_valid_token: float = 0, generator: torch.Generator | None = None) -> torch.Tensor:
    """A random (B, T) int64 attention mask for test batches: per row, a left padding of 0..max_left zeros, then
    min_valid..max_valid ones, then zeros (right padding).

    max_left = int(T * max_ratio_of_left_padding); max_valid = int(T * max_ratio_of_valid_token); min_valid =
    max(1, int(T * min_ratio_of_valid_token)). Draws from `generator` (torch's global one when None).
    """
    batch, length = input_ids.shape
    max_valid, max_left = int(length * max_ratio_of_valid_token), int(length * max_ratio_of_left_padding)
    min_valid = max(1, int(length * min_ratio_of_valid_token))
    if not (0 < max_ratio_of_valid_token <= 1 and 0 <= max_ratio_of_left_padding < 1 and max_valid >= 1
            and min_valid <= max_valid and max_valid + max_left <= length):
        raise ValueError(f"create_random_mask: ratios valid<={max_ratio_of_valid_token}, left<="
                         f"{max_ratio_of_left_padding}, valid>={min_ratio_of_valid_token} do not fit {length} tokens "
                         "(need 0 < max valid <= 1, 0 <= left < 1, min <= max, max valid + max left <= 1)")
    left = torch.randint(0, max_left + 1, (batch, 1), generator=generator)
    valid = torch.randint(min_valid, max_valid + 1, (batch, 1), generator=generator)
    position = torch.arange(length).unsqueeze(0)
    return ((position >= left) & (position < left + valid)).to(torch.int64)


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


def _meta_safe_creation() -> Any:
    """Transformers' own guard for building on the meta device (tensors some models read with `.item()` in
    `__init__`, e.g. `torch.linspace` schedules, are still made on CPU); a no-op where it does not exist."""
    try:
        from transformers.initialization import meta_device_safe_creation_ops
    except ImportError:
        return contextlib.nullcontext()
    return meta_device_safe_creation_ops()


def loads_on_rank0_only(model_cfg: Any) -> bool:
    """True when rank 0 alone should read the weights of `model_cfg` and the other ranks build the model empty
    (`load_model(empty=True)`) and receive their shards from it (`rlpost.engine.fsdp.load_shards_from_rank0`):
    more than one rank, no LoRA, and no tied input/output embeddings (a tie built on the meta device would not
    survive materialisation). One copy of the full weights in host memory instead of one per rank."""
    import torch.distributed as dist

    if not (dist.is_initialized() and dist.get_world_size() > 1) or lora_enabled(model_cfg):
        return False
    import_external_libs(model_cfg.external_lib)  # registers the model types their configs name
    trust = bool(model_cfg.trust_remote_code)
    hf_config = load_hf_config(local_model_path(model_cfg), trust, model_cfg.override_config)
    return not bool(getattr(hf_config, "tie_word_embeddings", False))


def load_for_sharding(model_cfg: Any, dtype: torch.dtype, value_model: bool = False,
                      offload_policy: bool = False) -> tuple[torch.nn.Module, dict[str, torch.Tensor] | None]:
    """(model on CPU, full state dict or None) for FSDP sharding. With `loads_on_rank0_only` (and no CPU
    offload policy) rank 0 alone reads the weights and returns their state dict, the other ranks build the
    model empty and return {}: pass it to `rlpost.engine.fsdp.load_shards_from_rank0` after sharding."""
    import torch.distributed as dist

    if offload_policy or not loads_on_rank0_only(model_cfg):
        return load_model(model_cfg, dtype, value_model=value_model), None
    rank0 = dist.get_rank() == 0
    if rank0:
        logger.info("rank 0 reads %s; the other %d ranks build it empty and receive their shards",
                    model_cfg.path, dist.get_world_size() - 1)
    module = load_model(model_cfg, dtype, value_model=value_model, empty=not rank0)
    return module, (module.state_dict() if rank0 else {})


def load_model(model_cfg: Any, dtype: torch.dtype, value_model: bool = False, empty: bool = False) -> torch.nn.Module:
    """Load the HF model of `model.path` on CPU in `dtype`, SDPA attention (the eager formula for models whose
    attention SDPA cannot express: `rlpost.utils.model_traits`).

    Args:
        model_cfg: the `actor_rollout_ref.model` or `critic.model` group.
        dtype: dtype of the loaded weights (float32 master weights for trainable models).
        value_model: load `AutoModelForTokenClassification` with one label (a value head on the backbone)
            instead of a causal LM; the head is freshly initialised when the checkpoint has none.
        empty: build the architecture on the meta device and read no weights (see `loads_on_rank0_only`).

    Returns:
        the model (in eval mode, as `from_pretrained` leaves it), Liger's RMSNorm / RoPE / SwiGLU kernels in
        it when `use_liger` (causal LM), gradient checkpointing enabled when `enable_gradient_checkpointing`,
        its attention on packed rows without a mask when `use_remove_padding`.
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
    elif is_vision_language(hf_config):
        from transformers import AutoModelForImageTextToText

        cls = AutoModelForImageTextToText
    else:
        cls = AutoModelForCausalLM
    attn = model_traits(hf_config).attn_implementation
    if empty:
        with torch.device("meta"), _meta_safe_creation():
            model = cls.from_config(hf_config, dtype=dtype, trust_remote_code=trust, attn_implementation=attn)
        model.eval()  # the mode `from_pretrained` leaves a model in
    else:
        model = cls.from_pretrained(
            path, config=hf_config, dtype=dtype, trust_remote_code=trust, attn_implementation=attn
        )
    if not value_model and model_cfg.use_liger:  # the critic's model group has no use_liger (nor has verl's)
        apply_liger(model)
    if model_cfg.enable_gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if model_cfg.use_remove_padding:
        use_packed_attention(model)
    return model


def is_vision_language(hf_config: Any) -> bool:
    """True for a config with a vision tower (Qwen2-VL / Qwen2.5-VL / Qwen3-VL layout)."""
    return getattr(hf_config, "vision_config", None) is not None


def decoder_layer_classes(model: torch.nn.Module) -> tuple[type, ...]:
    """Classes of the transformer blocks (from HF `_no_split_modules`), the FSDP2 wrapping unit."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    classes = {type(m) for m in model.modules() if type(m).__name__ in names}
    return tuple(classes)
