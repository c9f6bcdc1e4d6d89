"""PF-PPO (`algorithm.use_pf_ppo`): after the advantages, the batch is resampled by its sequence scores
(`algorithm.pf_ppo.reweight_method`, `weight_pow`), so the updates see high-reward responses more often."""

from __future__ import annotations

from typing import Any

from rlpost import keys as K
from rlpost.protocol import DataProto
from rlpost.trainer.ppo import core_algos
from rlpost.trainer.ppo.features.base import StepFeature, register_step_feature


@register_step_feature("pf_ppo")
class PfPpo(StepFeature):
    """Reorders (resamples) the batch's rows by their sequence scores."""

    @classmethod
    def enabled_by(cls, config: Any) -> bool:
        return config.algorithm.use_pf_ppo

    def after_advantage(self, batch: DataProto, metrics: dict[str, Any]) -> None:
        pf = self.trainer.config.algorithm.pf_ppo
        scores = batch.batch[K.TOKEN_LEVEL_SCORES].sum(-1)
        batch.reorder(core_algos.pf_ppo_sample_indices(scores, pf.reweight_method, pf.weight_pow))
