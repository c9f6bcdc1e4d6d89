"""Rollout engines: vLLM (CPU build here, GPU), SGLang (GPU, import-guarded) and HF `generate`.

`build_rollout` imports the chosen engine module only when it is chosen, so vllm/sglang are never
imported by a run that does not use them. Each engine module registers its class in `ROLLOUT_REGISTRY`.
"""

from __future__ import annotations

import importlib
from typing import Any

from rlpost.utils.registry import Registry

ROLLOUT_REGISTRY = Registry("rollout engine")

# config.name -> module that registers it (imported lazily: importing vllm costs seconds and memory)
_ENGINE_MODULES = {"vllm": "rlpost.rollout.vllm", "sglang": "rlpost.rollout.sglang", "hf": "rlpost.rollout.hf"}


def engine_names() -> list[str]:
    """Every rollout engine name a config may select (built-in modules plus registered classes)."""
    return sorted(set(_ENGINE_MODULES) | set(ROLLOUT_REGISTRY.names()))


def build_rollout(config: Any, model_path: str, tokenizer: Any, device: str, module: Any = None,
                  lora_rank: int = 0):
    """Create the engine named by `config.name` (actor_rollout_ref.rollout).

    Args:
        config: the typed rollout group (`RolloutConfig`), or its DictConfig (converted and checked here, once).
        model_path: HF folder (tokenizer/config; weights too unless load_format is dummy_*).
        tokenizer: the HF tokenizer.
        device: "cpu" or "cuda".
        module: the actor's model; required by "hf", which generates with it.
        lora_rank: > 0 when the engine is to serve the actor's LoRA adapter (`BaseRollout.load_adapter`).

    Returns:
        a `BaseRollout`.

    Raises:
        ValueError: unknown engine name (lists the valid ones).
    """
    from rlpost.config.convert import typed_group
    from rlpost.config.schema_workers import RolloutConfig

    config = typed_group(config, RolloutConfig, "actor_rollout_ref.rollout.")
    name = config.name
    if name in _ENGINE_MODULES:
        importlib.import_module(_ENGINE_MODULES[name])
    elif name not in ROLLOUT_REGISTRY:
        raise ValueError(
            f"actor_rollout_ref.rollout.name={name!r} is not a rollout engine; valid: {sorted(_ENGINE_MODULES)}"
        )
    extra = {"lora_rank": lora_rank} if lora_rank > 0 else {}
    return ROLLOUT_REGISTRY.get(name)(config, model_path, tokenizer, device, module=module, **extra)
