"""GDPO's per-component reward metrics (`algorithm.adv_estimator=gdpo`): `gdpo/<key>/{mean,std,max,min}` of each
component named by `algorithm.gdpo_reward_keys`."""

from __future__ import annotations

from typing import Any

from rlpost.protocol import DataProto
from rlpost.trainer.ppo.features.base import StepFeature, register_step_feature
from rlpost.trainer.ppo.metric_utils import reward_component_metrics


@register_step_feature("gdpo_metrics")
class GdpoMetrics(StepFeature):
    """After the advantages: the reward components' statistics."""

    def after_advantage(self, batch: DataProto, metrics: dict[str, Any]) -> None:
        keys = self.trainer.config.algorithm.gdpo_reward_keys
        metrics.update(reward_component_metrics(batch.non_tensor_batch, keys))
