"""ReMax's baseline (`algorithm.adv_estimator=remax`): each prompt's greedy response, scored by the reward
function, is the baseline its sampled response's return is compared with (`reward_baselines`, (B,))."""

from __future__ import annotations

from rlpost import keys as K
from rlpost.protocol import DataProto
from rlpost.trainer.ppo.features.base import StepFeature, register_step_feature
from rlpost.utils.profiler import simple_timer as phase_timer


@register_step_feature("remax_baseline")
class RemaxBaseline(StepFeature):
    """After generation: one greedy response per row (timed as `gen_max`) and its sequence score."""

    def after_generate(self, prompts: DataProto, timing: dict[str, float]) -> None:
        trainer = self.trainer
        with phase_timer("gen_max", timing):
            greedy = trainer._gen_inputs(prompts)
            greedy.meta_info[K.META_DO_SAMPLE] = False
            greedy_out = trainer.rollouts.generate_sequences(greedy)
            greedy_out.meta_info.pop(K.META_METRICS, None)
            prompts.batch[K.REWARD_BASELINES] = trainer._score_only(prompts, greedy_out)
