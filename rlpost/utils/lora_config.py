"""Whether a model group trains LoRA adapters, and their rank: the config's `lora_rank`, or, as in verl, a saved
adapter's own `adapter_config.json` when only `lora_adapter_path` is given. No torch: the config rules use it."""

from __future__ import annotations

import json
import os
from typing import Any


def lora_enabled(model_cfg: Any) -> bool:
    """True when the model group trains LoRA adapters: `lora_rank` > 0 or a `lora_adapter_path` to start from."""
    return int(getattr(model_cfg, "lora_rank", 0) or 0) > 0 or bool(getattr(model_cfg, "lora_adapter_path", None))


def saved_adapter_config(path: str) -> dict[str, Any] | None:
    """`adapter_config.json` of a PEFT adapter folder, or None when there is none (yet) to read."""
    config_file = os.path.join(os.path.expanduser(path), "adapter_config.json")
    try:
        with open(config_file) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def lora_rank_of(model_cfg: Any) -> int | None:
    """The adapters' rank: `lora_rank` when set, else the saved adapter's `r` (None while that is unreadable;
    start-up's `check_adapter_folder` names the missing file)."""
    if int(getattr(model_cfg, "lora_rank", 0) or 0) > 0:
        return int(model_cfg.lora_rank)
    path = getattr(model_cfg, "lora_adapter_path", None)
    saved = saved_adapter_config(str(path)) if path else None
    return None if saved is None or saved.get("r") is None else int(saved["r"])
