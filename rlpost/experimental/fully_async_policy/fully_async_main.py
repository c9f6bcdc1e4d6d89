"""verl's fully-async entry point: the same command line, run as rlpost's fully asynchronous mode.

    python -m rlpost.experimental.fully_async_policy.fully_async_main [ppo_trainer overrides] \\
        rollout.nnodes=1 rollout.n_gpus_per_node=1 \\
        async_training.staleness_threshold=0.5 async_training.trigger_parameter_sync_step=2

The `async_training.*` group (defaults: config/async_training.yaml beside this file) and verl's top-level
`rollout.*` group of this recipe are translated into ppo_trainer keys, then `rlpost.trainer.main_ppo` runs:
split placement (`actor_rollout_ref.hybrid_engine=false`), the engine's log-probs, and
`trainer.v1.trainer_mode=separate_async` with a queue `k - 1 + ceil(staleness_threshold * k)` batches deep,
the same staleness bound enforced by waiting, and the weights pushed every `k = trigger_parameter_sync_step`
steps (with staleness_threshold=0 and k=1: on-policy split placement). `partial_rollout=true` sets
`trainer.v1.separate_async.partial_rollout=true`; `compute_prox_log_prob=true` has the actor recompute the
proximal log-probs (`bypass_mode=false`) and weights each token by proximal / behaviour probability
(`rollout_is=token` unless given): decoupled PPO.
"""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass
from typing import Annotated

from omegaconf import OmegaConf

from rlpost.config.base import BaseConfig
from rlpost.config.constraints import NON_NEGATIVE, POSITIVE, violations
from rlpost.experimental.recipe_cli import run_translated
from rlpost.trainer.config.errors import ConfigError

ARR = "actor_rollout_ref"
DEFAULTS = os.path.join(os.path.dirname(__file__), "config", "async_training.yaml")
CONFIG_NAMES = ("fully_async_ppo_trainer", "fully_async_ppo_trainer.yaml")
# verl's top-level rollout group of this recipe -> the ppo_trainer key it sets
ROLLOUT_KEYS = {"nnodes": f"{ARR}.rollout.nnodes", "n_gpus_per_node": f"{ARR}.rollout.n_gpus_per_node",
                "n": f"{ARR}.rollout.n", "total_epochs": "trainer.total_epochs", "test_freq": "trainer.test_freq"}
# verl's recipe scripts pass these; rlpost computes or does not need them
RECIPE_BATCH = {"data.train_batch_size": "0", "data.gen_batch_size": "1"}
NOTICE = {"data.train_batch_size": "it is require_batches x ppo_mini_batch_size here",
          "data.gen_batch_size": "each generation here is one trainer step's batch of prompts"}
REFUSED = ("use_trainer_do_validate",
           "checkpoint_engine.overlap_broadcast_and_consume")


@dataclass(frozen=True)
class CheckpointEngineConfig(BaseConfig):
    """`async_training.checkpoint_engine`."""

    enable: bool
    device_buffer_size_M: Annotated[int, POSITIVE]
    overlap_broadcast_and_consume: bool


@dataclass(frozen=True)
class AsyncTrainingConfig(BaseConfig):
    """`async_training` (config/async_training.yaml)."""

    staleness_threshold: Annotated[float, NON_NEGATIVE]
    trigger_parameter_sync_step: Annotated[int, POSITIVE]
    require_batches: Annotated[int, POSITIVE]
    partial_rollout: bool
    use_rollout_log_probs: bool
    compute_prox_log_prob: bool
    use_trainer_do_validate: bool
    checkpoint_engine: CheckpointEngineConfig


def read_async_training(overrides: dict) -> AsyncTrainingConfig:
    """The typed `async_training` group: the YAML defaults with `overrides` ({dotted key below the group:
    value}) merged, every value checked; refused features named."""
    cfg = OmegaConf.load(DEFAULTS)
    for key, value in overrides.items():
        if OmegaConf.select(cfg, key, default="<missing>") == "<missing>":
            known = ", ".join(sorted(_leaves(cfg)))
            raise ConfigError(f"async_training.{key}: no such key of verl's fully-async group; keys: {known}.")
        OmegaConf.update(cfg, key, value)
    raw = OmegaConf.to_container(cfg)
    for key in ("staleness_threshold", "trigger_parameter_sync_step", "require_batches",
                "checkpoint_engine.device_buffer_size_M"):
        value = OmegaConf.select(cfg, key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                (key != "staleness_threshold" and not isinstance(value, int)):
            raise ConfigError(f"async_training.{key}={value}: must be a number; use async_training.{key}="
                              f"{OmegaConf.select(OmegaConf.load(DEFAULTS), key)}.")
    typed = AsyncTrainingConfig(**{**raw, "checkpoint_engine": CheckpointEngineConfig(**raw["checkpoint_engine"])})
    for key, value, rule in violations(typed, "async_training."):
        raise ConfigError(f"{key}={value}: {rule.rule}; use {key}={rule.fix(value)}.")
    for key in REFUSED:
        if typed.select(key):
            raise ConfigError(f"not supported yet: async_training.{key}=true (is not built); use "
                              f"async_training.{key}=false.")
    return typed


def _leaves(cfg, prefix: str = "") -> list[str]:
    out = []
    for key, value in cfg.items():
        out += _leaves(value, f"{prefix}{key}.") if OmegaConf.is_dict(value) else [f"{prefix}{key}"]
    return out


def ppo_overrides(at: AsyncTrainingConfig, given: dict[str, str]) -> list[str]:
    """The ppo_trainer overrides that run `at`; `given` holds the user's own ppo_trainer overrides (a value
    set there and implied here must agree)."""
    k = at.trigger_parameter_sync_step
    depth = k - 1 + math.ceil(at.staleness_threshold * k)
    out = {f"{ARR}.hybrid_engine": "false", f"{ARR}.rollout.calculate_log_probs": "true"}
    if depth == 0:
        if at.partial_rollout:
            raise ConfigError(f"async_training.partial_rollout=true with staleness_threshold={at.staleness_threshold}, "
                              f"trigger_parameter_sync_step={k}: nothing is generated ahead of training to pause; "
                              "use async_training.staleness_threshold=0.5 (or async_training.partial_rollout=false).")
        out["trainer.v1.trainer_mode"] = "sync"
    else:
        out.update({"trainer.v1.trainer_mode": "separate_async", "trainer.v1.separate_async.num_warmup_batches":
                    str(depth), "trainer.v1.separate_async.parameter_sync_step": str(k),
                    "trainer.v1.sampler.max_off_policy_threshold": str(depth),
                    "trainer.v1.sampler.max_off_policy_strategy": "wait"})
        if at.partial_rollout:
            out["trainer.v1.separate_async.partial_rollout"] = "true"
    if at.compute_prox_log_prob:  # decoupled PPO: the actor recomputes the proximal policy's log-probs
        out["algorithm.rollout_correction.bypass_mode"] = "false"
        if "algorithm.rollout_correction.rollout_is" not in given:
            out["algorithm.rollout_correction.rollout_is"] = "token"
    elif at.use_rollout_log_probs:
        out["algorithm.rollout_correction.bypass_mode"] = "true"
    mini = given.get(f"{ARR}.actor.ppo_mini_batch_size")
    if mini is None:
        from rlpost.config.defaults import default_of

        mini = default_of(f"{ARR}.actor.ppo_mini_batch_size")
    out["data.train_batch_size"] = str(at.require_batches * int(mini))
    for key, value in out.items():
        if key in given and str(given[key]).lower() != value:
            raise ConfigError(f"{key}={given[key]}: the fully-async recipe sets {key}={value} (from "
                              f"async_training.*); remove the override of {key}.")
    return [f"{key}={value}" for key, value in out.items()]


def translate(args: list[str]) -> list[str]:
    """This recipe's command line (verl's) as a main_ppo command line."""
    kept, async_overrides, given, rollout = [], {}, {}, {}
    for arg in args:
        if arg.startswith("--config-name") and arg.split("=", 1)[-1] in CONFIG_NAMES:
            continue  # the recipe's config is ppo_trainer plus the groups translated here
        key, sep, value = arg.lstrip("+").partition("=")
        if sep and key.startswith("async_training."):
            async_overrides[key.removeprefix("async_training.")] = OmegaConf.from_dotlist([f"v={value}"]).v
            continue
        if sep and key.startswith("rollout."):
            name = key.removeprefix("rollout.")
            if name == "total_rollout_steps":
                rollout[name] = value
            elif name in ROLLOUT_KEYS:
                kept.append(f"{ROLLOUT_KEYS[name]}={value}")
            else:
                raise ConfigError(f"rollout.{name}: not a key of verl's fully-async rollout group; keys: "
                                  f"{', '.join([*ROLLOUT_KEYS, 'total_rollout_steps'])} (or set "
                                  f"{ARR}.rollout.{name}).")
            continue
        if sep and key in RECIPE_BATCH and value == RECIPE_BATCH[key]:
            print(f"config notice: {arg} of verl's fully-async recipe: {NOTICE[key]}", file=sys.stderr)
            continue
        if sep and not key.startswith("-"):
            given[key] = value
        kept.append(arg)
    at = read_async_training(async_overrides)
    extra = ppo_overrides(at, given)
    if "total_rollout_steps" in rollout:  # verl: total_rollout_steps = data.train_batch_size * steps
        batch = int(next(e for e in extra if e.startswith("data.train_batch_size=")).split("=")[1])
        extra.append(f"trainer.total_training_steps={max(1, int(rollout['total_rollout_steps']) // batch)}")
    return kept + extra


def main() -> None:
    """Console entry point."""
    run_translated(translate)


if __name__ == "__main__":
    from rlpost.trainer.main_ppo import _exit_after_run

    main()
    _exit_after_run()
