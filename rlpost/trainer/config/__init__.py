"""Config of the PPO trainer: Hydra YAML defaults beside this file, typed schema, start-up checks.

Public API:
    validate_config(cfg) -> cfg        map deprecated keys, check everything, raise ConfigError
    typed_config(cfg) -> PPOTrainerConfig   the same checks on a copy, returning the typed dataclasses
    as_typed(config) -> PPOTrainerConfig     a typed config as it is, a DictConfig through typed_config
    need_critic(cfg), need_reference_policy(cfg)   roles the config creates
    CONFIG_DIR                           this folder (for Hydra's `initialize_config_dir`)
"""

from rlpost.trainer.config.defaults import CONFIG_DIR
from rlpost.trainer.config.errors import ConfigError, ConfigWarning
from rlpost.trainer.config.roles import need_critic, need_reference_policy, need_reward_model
from rlpost.config.schema import PPOTrainerConfig
from rlpost.trainer.config.validate import as_typed, typed_config, validate_config

__all__ = [
    "CONFIG_DIR",
    "as_typed",
    "ConfigError",
    "ConfigWarning",
    "PPOTrainerConfig",
    "need_critic",
    "need_reference_policy",
    "need_reward_model",
    "typed_config",
    "validate_config",
]
