"""Start-up checks of a vision-language run (before Ray): the processor the datasets need, and the combinations
that are not built for a Qwen2-VL-family policy yet, each refused naming its key and a value that works."""

from __future__ import annotations

import os
from typing import Any


def policy_hf_config(config: Any) -> Any:
    """The actor's HF config (None when its folder has no readable config.json: reported where it loads)."""
    from rlpost.utils.model import load_hf_config

    model = config.actor_rollout_ref.model
    path = os.path.expanduser(str(model.path))
    if not os.path.isfile(os.path.join(path, "config.json")):
        return None
    try:
        return load_hf_config(path, model.trust_remote_code, model.override_config)
    except (OSError, ValueError, KeyError):
        return None


def load_processor(config: Any) -> Any:
    """The policy's multimodal processor for a vision-language model, None for a text model.

    Raises:
        ValueError: a vision-language model whose folder holds no processor files.
    """
    from rlpost.utils.model import is_vision_language
    from rlpost.utils.tokenizer import hf_processor

    hf_config = policy_hf_config(config)
    if hf_config is None or not is_vision_language(hf_config):
        return None
    path = str(config.actor_rollout_ref.model.path)
    processor = hf_processor(path, trust_remote_code=bool(config.data.trust_remote_code))
    if processor is None or not hasattr(processor, "image_processor"):
        raise ValueError(f"actor_rollout_ref.model.path={path}: a vision-language model "
                         f"({type(hf_config).__name__}) without a processor (no processor_config.json / "
                         "preprocessor_config.json); save the model's AutoProcessor into the folder "
                         "(processor.save_pretrained(path))")
    return processor


def lora_adapts_vision_tower(model_cfg: Any) -> bool:
    """True when LoRA is on and its `target_modules` / `exclude_modules` put an adapter into the vision tower
    (matched by PEFT on the architecture built on the meta device: no weights read)."""
    import torch
    from peft import get_peft_model
    from transformers import AutoModelForImageTextToText

    from rlpost.engine.lora import peft_config
    from rlpost.utils.lora_config import lora_enabled
    from rlpost.utils.model import load_hf_config

    if not lora_enabled(model_cfg) or model_cfg.lora_adapter_path:  # a saved adapter: its own targets
        return False
    hf_config = load_hf_config(os.path.expanduser(str(model_cfg.path)), model_cfg.trust_remote_code,
                               model_cfg.override_config)
    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(hf_config)
    try:
        wrapped = get_peft_model(model, peft_config(model_cfg))
    except ValueError:  # matches nothing: reported with the model's layers where LoRA is applied
        return False
    return any(".visual." in f".{n}" and ".lora_A." in n for n, _ in wrapped.named_parameters())


def vision_refusals(config: Any) -> list[str]:
    """Why a vision-language policy cannot run with this config ([] when it can, or for a text model)."""
    from rlpost.trainer.config.roles import need_critic
    from rlpost.utils.model import is_vision_language

    hf_config = policy_hf_config(config)
    if hf_config is None or not is_vision_language(hf_config):
        return []
    arr = config.actor_rollout_ref
    name = type(hf_config).__name__
    why = []
    checks = [
        (lora_adapts_vision_tower(arr.model), "actor_rollout_ref.model.target_modules with a LoRA adapter in the "
         "vision tower", "LoRA trains the language model; set actor_rollout_ref.model.exclude_modules='.*visual.*'"),
        (arr.rollout.name != "vllm", f"actor_rollout_ref.rollout.name={arr.rollout.name}",
         "only the vLLM engine gets the images; set it to vllm"),
        (bool(arr.rollout.multi_turn.enable), "actor_rollout_ref.rollout.multi_turn.enable=true",
         "agent loops do not carry images; set it to false"),
        (need_critic(config), "a critic (algorithm.adv_estimator=gae)",
         "the critic has no vision-language value model; use a critic-free estimator such as grpo"),
    ]
    for refused, key, fix in checks:
        if refused:
            why.append(f"not supported yet: {key} with a vision-language model ({name}): {fix}")
    return why


def check_vision_inputs(config: Any) -> Any:
    """Refuse what a vision-language policy cannot run (the first reason), then return its processor (None
    for a text model)."""
    why = vision_refusals(config)
    if why:
        raise ValueError(why[0])
    return load_processor(config)
