"""Typed configuration: the dataclasses every layer reads (the validated contract).

`rlpost.trainer.config` composes the YAML defaults with Hydra, validates them and builds these objects;
workers, rollout engines, reward and data code receive the typed sub-configs. Each class also answers
the dict-style calls verl code uses (`cfg.get("key")`, `cfg["key"]`, `"key" in cfg`), see `BaseConfig`.
"""

from rlpost.config.base import BaseConfig, to_plain
from rlpost.config.schema import PPOTrainerConfig

__all__ = ["BaseConfig", "PPOTrainerConfig", "to_plain"]
