"""On-policy distillation (`distillation.enabled`): after the advantages, the teachers score the student's
sampled tokens (`teacher_log_probs`, timed as `teacher`); the divergence becomes a term of the actor's loss, or
with `use_policy_gradient` the advantages themselves (`rlpost.algos.distillation`)."""

from __future__ import annotations

import time
from typing import Any

import torch

from rlpost import keys as K
from rlpost.algos.distillation import distillation_advantages, distillation_metrics
from rlpost.protocol import DataProto
from rlpost.trainer.ppo.features.base import StepFeature, register_step_feature


@register_step_feature("distillation")
class Distillation(StepFeature):
    """The teachers' log-probs into the batch, and the distillation loss or advantages from them."""

    @classmethod
    def enabled_by(cls, config: Any) -> bool:
        return bool(config.distillation.enabled)

    def after_advantage(self, batch: DataProto, metrics: dict[str, Any]) -> None:
        trainer = self.trainer
        loss = trainer.config.distillation.distillation_loss
        start = time.perf_counter()
        teacher = trainer.workers.teacher.compute_teacher_log_prob(batch).batch[K.TEACHER_LOG_PROBS]
        metrics["timing_s/teacher"] = time.perf_counter() - start
        mask, old = batch.batch[K.RESPONSE_MASK], batch.batch[K.OLD_LOG_PROBS]
        metrics.update(distillation_metrics(old, teacher, mask))
        task = batch.batch[K.ADVANTAGES] if loss.use_task_rewards else None
        if loss.use_policy_gradient:
            batch.batch[K.ADVANTAGES] = distillation_advantages(
                old, teacher, mask, loss.loss_mode, loss.distillation_loss_coef, loss.log_prob_min_clamp,
                loss.loss_max_clamp, task_advantages=task)
            return
        batch.batch[K.TEACHER_LOG_PROBS] = teacher
        batch.meta_info[K.META_DISTILLATION] = {
            "loss_mode": loss.loss_mode, "coef": float(loss.distillation_loss_coef),
            "loss_max_clamp": loss.loss_max_clamp, "log_prob_min_clamp": loss.log_prob_min_clamp}
        if task is None:  # the teacher is the only signal: the policy-gradient term has nothing to push
            batch.batch[K.ADVANTAGES] = torch.zeros_like(batch.batch[K.ADVANTAGES])
