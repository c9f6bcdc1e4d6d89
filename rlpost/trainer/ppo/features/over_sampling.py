"""Over-sampling (`actor_rollout_ref.rollout.over_sample_rate` > 0): the rollout generates for more prompts than
the step trains on and aborts the slowest groups once enough are done; the step keeps `data.train_batch_size`
finished groups (`rlpost.trainer.ppo.over_sample.keep_finished_groups`, metrics `rollout/over_sample/*`)."""

from __future__ import annotations

from typing import Any

from rlpost.protocol import DataProto
from rlpost.trainer.ppo.features.base import StepFeature, register_step_feature
from rlpost.trainer.ppo.over_sample import keep_finished_groups


@register_step_feature("over_sampling")
class OverSampling(StepFeature):
    """After generation: drop the groups the rollout cut, keep the first `data.train_batch_size` finished ones."""

    @classmethod
    def enabled_by(cls, config: Any) -> bool:
        return config.actor_rollout_ref.rollout.over_sample_rate > 0

    def after_rollout(self, batch: DataProto, metrics: dict[str, Any]) -> DataProto:
        return keep_finished_groups(batch, self.trainer.config.data.train_batch_size, metrics)
