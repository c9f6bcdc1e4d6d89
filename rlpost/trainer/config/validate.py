"""`validate_config(cfg)`: the start-up check every entry point runs before Ray starts.

Order: deprecated aliases (mapped in place, with warnings), types and unknown keys, features not
built yet, enumerations, ranges, combinations, batch arithmetic. The first failure raises one
`ConfigError` naming the key(s), the value(s), the rule and a valid value.
"""

import copy
from typing import Any

from omegaconf import DictConfig, open_dict

from rlpost.trainer.config.aliases import apply_aliases
from rlpost.trainer.config.batch_rules import check_batch_sizes
from rlpost.trainer.config.convert import to_typed
from rlpost.trainer.config.distillation_rules import check_distillation, fill_teacher_entries
from rlpost.trainer.config.judge_rules import check_judge
from rlpost.trainer.config.errors import ConfigError, warn
from rlpost.trainer.config.profiling_rules import check_profiling
from rlpost.trainer.config.async_rules import check_async
from rlpost.trainer.config.placement_rules import check_placement
from rlpost.trainer.config.roles import need_critic
from rlpost.trainer.config.over_sample import check_over_sample
from rlpost.trainer.config.rules import (check_combinations, check_enums, check_liger, check_lora,
                                         check_multi_turn, check_ranges, check_sequence_parallel)
from rlpost.config.schema import PPOTrainerConfig
from rlpost.trainer.config.unsupported import check_not_supported, notices


def validate_config(cfg: DictConfig) -> DictConfig:
    """Check a composed `ppo_trainer` config; map deprecated keys in place and return `cfg` (verl's helper,
    for code that keeps reading the DictConfig; entry points use `typed_config`, which leaves `cfg` as it is).

    Args:
        cfg: the composed config (from Hydra's main or `compose`).

    Returns:
        The same object, cleaned: deprecated keys copied onto their new names, `trainer.logger`
        always a list, null entries of `custom_reward_function.reward_kwargs` removed.

    Raises:
        ConfigError: the first bad value or combination, in one message.
    """
    _check(cfg)
    kwargs = cfg.custom_reward_function.reward_kwargs
    with open_dict(kwargs):
        for name in [k for k, v in kwargs.items() if v is None]:
            del kwargs[name]  # unset example kwargs must not reach compute_score
    return cfg


def typed_config(cfg: DictConfig) -> PPOTrainerConfig:
    """Run every check on `cfg` and return the typed dataclasses: the one conversion of a run.

    `cfg` itself is not changed: deprecated keys are mapped onto a copy."""
    if not isinstance(cfg, DictConfig):
        raise ConfigError(f"expected a composed DictConfig, got {type(cfg).__name__}; compose ppo_trainer first.")
    return _check(copy.deepcopy(cfg))


def as_typed(config: Any) -> PPOTrainerConfig:
    """`config` if it is already the validated `PPOTrainerConfig` (what `main_ppo` hands down), else
    `typed_config(config)`: a verl-style caller may pass the composed DictConfig to any entry point."""
    return config if isinstance(config, PPOTrainerConfig) else typed_config(config)


def _check(cfg: DictConfig) -> PPOTrainerConfig:
    """Aliases applied to `cfg` in place, then every check; the typed dataclasses."""
    if not isinstance(cfg, DictConfig):
        raise ConfigError(f"expected a composed DictConfig, got {type(cfg).__name__}; compose ppo_trainer first.")
    spelled = apply_aliases(cfg)
    fill_teacher_entries(cfg)
    typed = to_typed(cfg)
    check_not_supported(cfg, spelled)
    for line in notices(cfg):
        warn(line)
    check_enums(typed, spelled)
    check_ranges(typed)
    check_over_sample(typed)
    check_combinations(typed)
    check_multi_turn(typed)
    check_lora(typed)
    check_liger(typed)
    check_placement(typed)
    check_async(typed)
    check_distillation(typed)
    check_judge(typed)
    need_critic(typed)
    check_sequence_parallel(typed)
    check_batch_sizes(typed)
    check_profiling(typed)
    return typed

