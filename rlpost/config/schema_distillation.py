"""Typed `distillation` group: on-policy distillation from frozen teachers (verl's keys; the YAML holds the
defaults and what each key means)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlpost.config.base import BaseConfig


@dataclass(frozen=True)
class DistillationLossConfig(BaseConfig):
    """`distillation.distillation_loss`: which divergence, and how it enters the actor's update."""

    loss_mode: str
    topk: int | None
    use_task_rewards: bool
    distillation_loss_coef: float
    loss_max_clamp: float | None
    log_prob_min_clamp: float | None
    use_policy_gradient: bool
    policy_loss_mode: str
    clip_ratio: float
    clip_ratio_low: float
    clip_ratio_high: float


@dataclass(frozen=True)
class TeacherModelConfig(BaseConfig):
    """`distillation.teacher_models.<name>`: one teacher. `inference` holds verl's engine settings (rlpost's
    teacher is an FSDP forward, so they are not read)."""

    key: str | None
    model_path: str | None
    num_replicas: int
    weight: float
    inference: dict[str, Any]


@dataclass(frozen=True)
class DistillationConfig(BaseConfig):
    """`distillation`: on/off, the loss, the teachers' pool and the teachers."""

    enabled: bool
    teacher_key: str
    distillation_loss: DistillationLossConfig
    n_gpus_per_node: int
    nnodes: int
    teacher_models: dict[str, TeacherModelConfig]

    def teachers(self) -> dict[str, TeacherModelConfig]:
        """The teachers that are created: the entries with a model_path."""
        return {name: t for name, t in self.teacher_models.items() if t.model_path}
