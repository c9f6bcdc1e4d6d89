"""Typed schema of `trainer.v1`: verl's v1 trainer modes. rlpost builds `sync` (the default) and
`separate_async` (rollout engines on their own devices generating continuously into a bounded queue, the
trainer taking each batch as soon as it is finished); `colocate_async` is refused (unsupported.py).

Types and constraints only; the defaults live in rlpost/trainer/config/trainer/*.yaml.
"""

from dataclasses import dataclass
from typing import Annotated, Any

from rlpost.config.base import BaseConfig
from rlpost.config.constraints import NON_NEGATIVE, POSITIVE


@dataclass(frozen=True)
class SeparateAsyncConfig(BaseConfig):
    """`trainer.v1.separate_async`: the queue between the rollout devices and the trainer."""

    num_warmup_batches: Annotated[int, POSITIVE]  # generations queued ahead of the batch being trained
    parameter_sync_step: Annotated[int, POSITIVE]  # trainer steps between two weight pushes
    partial_rollout: bool  # pause in-flight generations at a push, resume them with the new weights
    partial_rollout_tokens: Annotated[int, POSITIVE]  # tokens a queued generation runs before each pause
    hybrid_rollout: dict[str, Any]  # not built (unsupported.UNBUILT_GROUPS)


@dataclass(frozen=True)
class SamplerConfig(BaseConfig):
    """`trainer.v1.sampler`: the staleness bound enforced at the queue."""

    max_off_policy_threshold: Annotated[int, NON_NEGATIVE]  # max policy versions a trained sample lags behind
    max_off_policy_strategy: str  # drop | wait (rules.check_async)
    sync_refill_failed_groups: bool  # not built (unsupported.py)
    custom_sampler: dict[str, Any]  # not built (unsupported.UNBUILT_GROUPS)
    sampler_kwargs: dict[str, Any]  # not built (unsupported.py)


@dataclass(frozen=True)
class TrainerV1Config(BaseConfig):
    """`trainer.v1`."""

    trainer_mode: str  # sync | separate_async (colocate_async: not supported yet)
    sync: dict[str, Any]  # verl's sync mode has no settings
    colocate_async: dict[str, Any]  # not built (unsupported.UNBUILT_GROUPS)
    separate_async: SeparateAsyncConfig
    sampler: SamplerConfig
