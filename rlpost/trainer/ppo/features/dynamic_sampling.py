"""DAPO's dynamic sampling (`algorithm.filter_groups.enable`): generation and reward repeat over further batches
of prompts until `data.train_batch_size` groups whose `filter_groups.metric` varies are kept (a group whose
responses all score alike has zero group advantage and teaches nothing)."""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np

from rlpost import keys as K
from rlpost.algos.filter_groups import group_metric, kept_group_rows
from rlpost.protocol import DataProto
from rlpost.trainer.ppo.dynamic_sampling import first_groups, next_batch
from rlpost.trainer.ppo.features.base import StepFeature, register_step_feature


@register_step_feature("dynamic_sampling")
class DynamicSampling(StepFeature):
    """Generates and scores the step's batch itself (`generates_scored`); metrics `training/num_gen_batches`
    and `training/filter_groups_kept_fraction`."""

    generates_scored = True

    @classmethod
    def enabled_by(cls, config: Any) -> bool:
        return config.algorithm.filter_groups.enable

    def generate_scored(self, batch: DataProto, more_batches: Iterator[dict] | None, timing: dict[str, float],
                        metrics: dict[str, Any]) -> tuple[DataProto, list[str]]:
        """Keep the groups whose metric varies, drawing batches from `more_batches` until enough are kept; then
        trim to exactly `data.train_batch_size` groups. Returns the kept rows and the reward's extra keys."""
        trainer = self.trainer
        fg, want = trainer.config.algorithm.filter_groups, trainer.config.data.train_batch_size
        kept, n_kept, n_seen, n_gen = [], 0, 0, 0
        while True:
            n_gen += 1
            batch, reward_keys = trainer._generate_and_score(batch, timing)
            scores, uids = batch.batch[K.TOKEN_LEVEL_SCORES], batch.non_tensor_batch[K.UID]
            # The in-reward KL penalty comes later (it needs the reference): rewards == scores here.
            values = group_metric(fg.metric, scores, scores, {k: batch.non_tensor_batch[k] for k in reward_keys})
            rows = np.asarray(kept_group_rows(uids, values), dtype=np.int64)
            kept.append(batch.select_idxs(rows))
            n_kept += len(set(uids[rows]))
            n_seen += len(set(uids))
            if n_kept >= want:
                break
            if 0 < fg.max_num_gen_batches <= n_gen:
                raise RuntimeError(
                    f"algorithm.filter_groups: {n_gen} generation batches (algorithm.filter_groups.max_num_gen_batches="
                    f"{fg.max_num_gen_batches}) of data.gen_batch_size={trainer.config.data.gen_batch_size} prompts "
                    f"kept {n_kept} groups whose {fg.metric!r} varies, fewer than data.train_batch_size={want}: raise "
                    f"max_num_gen_batches (0 = no limit) or data.gen_batch_size, or pick another "
                    f"algorithm.filter_groups.metric")
            batch = next_batch(more_batches)
        metrics["training/num_gen_batches"] = n_gen
        metrics["training/filter_groups_kept_fraction"] = n_kept / n_seen
        return first_groups(_concat_generations(kept), want), reward_keys


def _concat_generations(parts: list[DataProto]) -> DataProto:
    """The kept parts of several generations as one batch. Their bookkeeping (global step, rollout ticket)
    differs: the batch carries the first one's, and every part's metrics."""
    first = {k: v for k, v in parts[0].meta_info.items() if k != K.META_METRICS}
    for part in parts[1:]:
        part.meta_info = {**first, **{k: v for k, v in part.meta_info.items() if k == K.META_METRICS}}
    return DataProto.concat(parts)
