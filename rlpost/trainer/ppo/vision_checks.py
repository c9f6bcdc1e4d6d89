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
    sp = max(int(arr.actor.ulysses_sequence_parallel_size), int(arr.ref.ulysses_sequence_parallel_size))
    checks = [
        (arr.model.use_remove_padding, "actor_rollout_ref.model.use_remove_padding=true",
         "the packed path does not carry 3-D rotary positions yet; set it to false"),
        (sp > 1, f"actor_rollout_ref.actor.ulysses_sequence_parallel_size={sp}",
         "Ulysses runs on packed rows, which do not carry 3-D rotary positions yet; set it to 1"),
        (int(arr.model.lora_rank) > 0 or bool(arr.model.lora_adapter_path), "actor_rollout_ref.model.lora_rank",
         "LoRA on a vision-language model is not built; set lora_rank=0"),
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
