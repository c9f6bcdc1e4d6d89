"""Typed schema of offline generation's config (`rlpost/trainer/config/generation.yaml`).

`model`, `rollout` and `actor` keep verl's generation-file spelling and are free-form here: generation lays
`model` and `rollout` over the packaged policy defaults and types them as the rollout worker's
`ActorRolloutRefConfig` (`rlpost.trainer.main_generation.worker_config`); `actor` is read by nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from rlpost.config.base import BaseConfig
from rlpost.config.constraints import POSITIVE
from rlpost.config.schema import RayInitConfig


@dataclass(frozen=True)
class GenerationDevicesConfig(BaseConfig):
    """`trainer`: the devices (worker processes on cpu) the engines run on."""

    nnodes: Annotated[int, POSITIVE]
    n_gpus_per_node: Annotated[int, POSITIVE]
    device: str | None


@dataclass(frozen=True)
class GenerationDataConfig(BaseConfig):
    """`data`: the prompts in, the responses out."""

    path: str
    prompt_key: str
    n_samples: Annotated[int, POSITIVE]
    output_path: str
    batch_size: Annotated[int, POSITIVE]


@dataclass(frozen=True)
class GenerationConfig(BaseConfig):
    """The whole generation config."""

    trainer: GenerationDevicesConfig
    data: GenerationDataConfig
    model: dict[str, Any]
    rollout: dict[str, Any]
    actor: dict[str, Any]
    ray_init: RayInitConfig
