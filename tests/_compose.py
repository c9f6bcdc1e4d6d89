"""Configs for tests, built the way users get them: the packaged `ppo_trainer` YAML composed by Hydra with
command-line overrides, then validated as `main_ppo` does (deprecated keys mapped, every rule checked).

No test hand-writes a partial config, so none depends on a default that lives only in code. Import it as
`from _compose import compose_config, typed_config_of` (tests/ is on sys.path through tests/conftest.py).
"""

from __future__ import annotations

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from rlpost.config.schema import PPOTrainerConfig
from rlpost.trainer.config import CONFIG_DIR, typed_config, validate_config

# A small valid CPU setup (2 processes, tiny batches) that worker and data tests start from.
SMALL = (
    "trainer.device=cpu", "trainer.n_gpus_per_node=2",
    "data.train_batch_size=8", "data.max_prompt_length=16", "data.max_response_length=8",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
    "critic.ppo_micro_batch_size_per_gpu=2",
)


def compose_config(*overrides: str, validate: bool = True) -> DictConfig:
    """`ppo_trainer` composed with `overrides` (Hydra syntax: `key=value`, `++key=value`), validated unless
    `validate=False` (for keys the schema does not know yet)."""
    with initialize_config_dir(str(CONFIG_DIR), version_base=None):
        cfg = compose("ppo_trainer", overrides=list(overrides))
    return validate_config(cfg) if validate else cfg


def typed_config_of(*overrides: str) -> PPOTrainerConfig:
    """The validated typed dataclasses of `compose_config(*overrides)`."""
    return typed_config(compose_config(*overrides, validate=False))
