"""On-policy distillation (`distillation.enabled`): after the advantages, the teachers score the student's
sampled tokens (`teacher_log_probs`, timed as `teacher`); the divergence becomes a term of the actor's loss, or
with `use_policy_gradient` the advantages themselves (`rlpost.algos.distillation`).

In a top-k mode the old-log-prob pass also returns the student's top-k ids (asked for in `after_rollout`), the
teachers return their log-probs over the union of those and their own top-k, and the actor's loss is the
divergence over that support."""

from __future__ import annotations

import time
from typing import Any

import torch

from rlpost import keys as K
from rlpost.algos.distillation import distillation_advantages, distillation_metrics, is_topk_mode, topk_overlap
from rlpost.protocol import DataProto
from rlpost.trainer.ppo.features.base import StepFeature, register_step_feature


@register_step_feature("distillation")
class Distillation(StepFeature):
    """The teachers' log-probs into the batch, and the distillation loss or advantages from them."""

    @classmethod
    def enabled_by(cls, config: Any) -> bool:
        return bool(config.distillation.enabled)

    def after_rollout(self, batch: DataProto, metrics: dict[str, Any]) -> DataProto:
        loss = self.trainer.config.distillation.distillation_loss
        if is_topk_mode(loss.loss_mode):  # the old-log-prob pass then writes student_topk_ids
            batch.meta_info[K.META_STUDENT_TOPK] = int(loss.topk)
        return batch

    def after_advantage(self, batch: DataProto, metrics: dict[str, Any]) -> None:
        trainer = self.trainer
        loss = trainer.config.distillation.distillation_loss
        start = time.perf_counter()
        topk = is_topk_mode(loss.loss_mode)
        if topk:
            self._teacher_topk(batch, metrics)
            teacher = batch.batch[K.TEACHER_LOG_PROBS]
        else:
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

    def _teacher_topk(self, batch: DataProto, metrics: dict[str, Any]) -> None:
        """The teachers' top-k tensors into the batch, the top-k metrics into `metrics`; the ids only the metrics
        read leave the batch (they would otherwise travel to the actor's update)."""
        if K.STUDENT_TOPK_IDS not in batch.batch.keys():
            raise RuntimeError(f"top-k distillation needs {K.STUDENT_TOPK_IDS} from the old-log-prob pass (the rows "
                               "were not generated through the step's rollout, e.g. by dynamic sampling)")
        out = self.trainer.workers.teacher.compute_teacher_topk(batch)
        student_ids = batch.batch.pop(K.STUDENT_TOPK_IDS)
        own = out.batch.pop(K.TEACHER_OWN_TOPK_IDS)
        for key in (K.TEACHER_LOG_PROBS, K.TEACHER_TOPK_IDS, K.TEACHER_TOPK_LOG_PROBS):
            batch.batch[key] = out.batch[key]
        mask = batch.batch[K.RESPONSE_MASK]
        metrics["distillation/topk_overlap"] = topk_overlap(student_ids, own, mask)
        mass = batch.batch[K.TEACHER_TOPK_LOG_PROBS].exp().sum(-1)[mask.bool()]
        metrics["distillation/teacher_topk_mass"] = float(mass.mean()) if mass.numel() else 0.0
