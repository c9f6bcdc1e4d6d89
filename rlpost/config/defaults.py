"""The package's default `ppo_trainer` config, read straight from its YAML files (no Hydra): the one source
of defaults, for every layer (the YAML lives beside the trainer's Hydra entry, `rlpost/trainer/config/`).

Used for "use <key>=<default>" hints and for rebuilding a group that an old-style override replaced
(`rollout.multi_turn=true`). Hydra is not used here so that this works inside a running Hydra app.
"""

import functools
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

CONFIG_DIR = Path(__file__).resolve().parent.parent / "trainer" / "config"


@functools.lru_cache(maxsize=1)
def package_defaults() -> DictConfig:
    """The composed default of `ppo_trainer.yaml` (group options merged at their packages, then _self_)."""
    main = OmegaConf.load(CONFIG_DIR / "ppo_trainer.yaml")
    merged = OmegaConf.create({})
    for entry in main.pop("defaults"):
        if entry == "_self_":
            merged = OmegaConf.merge(merged, main)
            continue
        ((group_at_pkg, option),) = entry.items()
        group, _, package = str(group_at_pkg).partition("@")
        node = OmegaConf.load(CONFIG_DIR / group / f"{option}.yaml")
        OmegaConf.update(merged, package or group, node, merge=True, force_add=True)
    OmegaConf.set_readonly(merged, True)
    return merged


def default_of(key: str) -> Any:
    """Resolved default value of a dotted key (None when the key is not in the default config)."""
    value = OmegaConf.select(package_defaults(), key, default=None)
    return OmegaConf.to_container(value, resolve=True) if isinstance(value, DictConfig) else value
