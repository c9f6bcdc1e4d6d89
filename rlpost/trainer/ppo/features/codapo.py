"""CoDaPO's two phases per cycle (`algorithm.adv_estimator=codapo`): an original step on a batch from the data
loader, then a focused step on that batch's `codapo_top_k` questions of highest value, repeated round-robin to the
batch size with fresh uids (new groups, new rollouts). Both phases are training steps of their own
(`trainer.total_training_steps` counts both). A checkpoint taken between the two keeps the focused batch, so a
resumed run trains it next.

`CodapoFeature` joins the step at its named points (`rlpost.trainer.ppo.features.base`): `remember` after the
prompts get their uids, `observe` after the step's advantages, and its batches draw `take()` before the next
data-loader batch while `pending` is set.
"""

from __future__ import annotations

import os
from typing import Any, Iterator

import numpy as np
import torch

from rlpost import keys as K
from rlpost.algos.codapo import (codapo_settings, confidence_log_probs, correct_flags, question_values, round_robin,
                                 top_questions)
from rlpost.protocol import DataProto
from rlpost.trainer.ppo.features.base import StepFeature, register_step_feature

CODAPO_FILE = "codapo_focus.pt"


class CodapoCycle:
    """The state between a cycle's original and focused phase."""

    def __init__(self, algo_config: Any) -> None:
        self.top_k, _, self.accuracy_key = codapo_settings(algo_config)
        self.pending: dict[str, Any] | None = None  # the focused phase's prompt columns, one row per prompt
        self._in_focus = False  # the step running now is a focused phase
        self._prompts: DataProto | None = None

    def remember(self, prompts: DataProto) -> None:
        """This step's prompts, one row per question, with their uids."""
        self._prompts = prompts

    def observe(self, batch: DataProto) -> dict[str, float]:
        """After the step's advantages: on an original phase, the focused batch of its best questions (valued
        with the step's `response_mask`, after any rollout-correction rejection, as the estimator did)."""
        if self._in_focus:
            self._in_focus = False
            return {"codapo/is_focused_step": 1.0}
        uids = batch.non_tensor_batch[K.UID]
        log_probs = confidence_log_probs(batch.batch.get(K.ROLLOUT_LOG_PROBS), batch.batch.get(K.OLD_LOG_PROBS))
        values = question_values(correct_flags(batch.non_tensor_batch[self.accuracy_key]), log_probs,
                                 batch.batch[K.RESPONSE_MASK], uids)
        prompts = self._prompts
        chosen = top_questions(values, uids, self.top_k, order=prompts.non_tensor_batch[K.UID])
        position = {uid: i for i, uid in enumerate(prompts.non_tensor_batch[K.UID])}
        focus = prompts.select_idxs(np.asarray(round_robin([position[u] for u in chosen], len(prompts))))
        columns = {k: v for k, v in focus.non_tensor_batch.items() if k != K.UID}
        self.pending = {**{k: v for k, v in focus.batch.items()}, **columns}
        per_question = {uid: v for uid, v in zip(uids, values.tolist())}
        return {"codapo/is_focused_step": 0.0, "codapo/value/mean": float(np.mean(list(per_question.values()))),
                "codapo/selected_value/mean": float(np.mean([per_question[u] for u in chosen]))}

    def take(self) -> dict[str, Any]:
        """The focused phase's batch of prompts (a data-loader-like dict); the next step is that phase."""
        batch, self.pending, self._in_focus = self.pending, None, True
        return batch

    def save(self, folder: str) -> None:
        if self.pending is not None:
            torch.save(self.pending, os.path.join(folder, CODAPO_FILE))

    def load(self, folder: str) -> None:
        path = os.path.join(folder, CODAPO_FILE)
        self.pending = torch.load(path, weights_only=False) if os.path.exists(path) else None


@register_step_feature("codapo_cycle")
class CodapoFeature(StepFeature):
    """CoDaPO's cycle in the step: a focused step after each data-loader batch's step."""

    def __init__(self, trainer: Any) -> None:
        super().__init__(trainer)
        self.cycle = CodapoCycle(trainer.config.algorithm)

    def batches(self, loader: Iterator[dict]) -> Iterator[dict]:
        # a run resumed between the two phases: its focused step first, before the loader hands out (and
        # counts) the next batch
        yield from self._focused()
        for batch in loader:
            yield batch
            yield from self._focused()  # set by the step of `batch`, which has run by now

    def _focused(self) -> Iterator[dict]:
        if self.cycle.pending is not None:
            yield self.cycle.take()

    def after_prepare(self, prompts: DataProto) -> None:
        self.cycle.remember(prompts)

    def after_advantage(self, batch: DataProto, metrics: dict[str, Any]) -> None:
        metrics.update(self.cycle.observe(batch))

    def save(self, folder: str) -> None:
        self.cycle.save(folder)

    def load(self, folder: str) -> None:
        self.cycle.load(folder)
