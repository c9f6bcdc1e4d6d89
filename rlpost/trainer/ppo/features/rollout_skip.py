"""verl's rollout skip (`actor_rollout_ref.rollout.skip_rollout`): the first step's generated and scored batch is
saved in `rollout.skip_dump_dir`; every later step (of this run and of the next runs of the same experiment,
batch size and `rollout.n`) trains on that batch again instead of generating. For working on the training side
without paying for generation.

What is saved is the whole batch after the reward (prompts with their data fields, responses, the engine's
log-probs, scores and the reward's extra fields), so a loaded step's rewards belong to its responses. (verl saves
the generation output alone and joins it to each step's new prompts.)"""

from __future__ import annotations

import logging
import os
import pickle
from pathlib import Path
from typing import Any, Iterator

from rlpost import keys as K
from rlpost.protocol import DataProto
from rlpost.trainer.ppo.features.base import StepFeature, register_step_feature

logger = logging.getLogger(__name__)

REWARD_KEYS = "rollout_skip_reward_keys"  # meta_info of the saved batch: the reward's extra per-row fields


def dump_path(config: Any) -> Path:
    """`<skip_dump_dir>/<experiment>_<project>_GBS<train_batch_size>__N<rollout.n>.rlpost.pkl`."""
    rollout, trainer = config.actor_rollout_ref.rollout, config.trainer
    name = f"{trainer.experiment_name}_{trainer.project_name}_GBS{config.data.train_batch_size}__N{rollout.n}"
    return Path(os.path.expanduser(rollout.skip_dump_dir)) / f"{name}.rlpost.pkl"


@register_step_feature("rollout_skip")
class RolloutSkip(StepFeature):
    """Generates and scores the first step's batch and saves it; loads it for every step once it is saved.
    Metric `rollout_skip/loaded` (1 for a loaded step)."""

    generates_scored = True

    @classmethod
    def enabled_by(cls, config: Any) -> bool:
        return bool(config.actor_rollout_ref.rollout.skip_rollout)

    def __init__(self, trainer: Any) -> None:
        super().__init__(trainer)
        self.path = dump_path(trainer.config)
        state = f"training on the batch saved in {self.path}" if self.path.exists() else \
            f"the first step's batch will be saved in {self.path} and trained on at every step"
        logger.warning("actor_rollout_ref.rollout.skip_rollout=true: %s", state)

    def generate_scored(self, batch: DataProto, more_batches: Iterator[dict] | None, timing: dict[str, float],
                        metrics: dict[str, Any]) -> tuple[DataProto, list[str]]:
        trainer = self.trainer
        loaded = self.path.exists()
        if loaded:
            config = trainer.config
            batch = self._load(config.data.train_batch_size * config.actor_rollout_ref.rollout.n)
            keys = list(batch.meta_info.pop(REWARD_KEYS))
            batch.meta_info[K.META_GLOBAL_STEP] = trainer.global_steps
        else:
            batch, keys = trainer._generate_and_score(batch, timing)
            self._save(batch, keys)
        for feature in trainer.features:  # e.g. top-k distillation asks the old-log-prob pass for its ids
            if feature is not self:
                batch = feature.after_rollout(batch, metrics)
        metrics["rollout_skip/loaded"] = float(loaded)
        return batch, keys

    def _save(self, batch: DataProto, keys: list[str]) -> None:
        """Written whole to a temporary name, then renamed: a run stopped while saving leaves no partial file."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        saved = DataProto(batch.batch, batch.non_tensor_batch, {**batch.meta_info, REWARD_KEYS: list(keys)})
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "wb") as f:
            pickle.dump(saved, f)
        os.replace(tmp, self.path)

    def _load(self, rows: int) -> DataProto:
        """The saved batch, checked against this run's batch size and lengths."""
        data = self.trainer.config.data
        try:
            with open(self.path, "rb") as f:
                batch = pickle.load(f)
        except (OSError, pickle.UnpicklingError, EOFError, AttributeError) as err:
            raise ValueError(f"actor_rollout_ref.rollout.skip_rollout: {self.path} does not load ({err}); delete it "
                             "to generate and save a new batch") from None
        width = batch.batch[K.RESPONSES].shape[-1] if isinstance(batch, DataProto) else None
        if not isinstance(batch, DataProto) or REWARD_KEYS not in batch.meta_info:
            raise ValueError(f"actor_rollout_ref.rollout.skip_rollout: {self.path} is not a batch rlpost saved; "
                             "delete it (or set actor_rollout_ref.rollout.skip_dump_dir to another folder)")
        if len(batch) != rows or width > data.max_response_length:
            raise ValueError(f"actor_rollout_ref.rollout.skip_rollout: {self.path} holds {len(batch)} rows with "
                             f"responses of up to {width} tokens; this run wants {rows} rows (data.train_batch_size x "
                             f"rollout.n) of up to data.max_response_length={data.max_response_length}: delete the "
                             "file to generate a new batch")
        return batch
