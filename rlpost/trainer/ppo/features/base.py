"""The named points where features plug into the PPO step, and the registry of step features.

`RayPPOTrainer.train_step` reads as the algorithm; what a particular estimator or option adds to it (a greedy
baseline generation, a focused second step, per-component metrics, a reweighted batch) is a `StepFeature`:
one module each, registered by name. An estimator declares the features it runs
(`rlpost.algos.advantages.EstimatorNeeds.step_features`); a config option can turn one on by itself
(`StepFeature.enabled_by`). The trainer calls every active feature at each point, in registration order:

    batches(loader)          -> the step's prompt batches (a feature may add steps, e.g. CoDaPO's focused step)
    generate_scored(batch, more_batches, timing, metrics) -> (batch, reward keys): gen and reward together, in
                             place of the step's own gen (a feature with `generates_scored`, e.g. DAPO's
                             dynamic sampling)
    after_prepare(prompts)   the batch's prompts with their uids, before they are repeated rollout.n times
    after_rollout(batch, metrics) -> batch: the generated batch (responses joined), before balancing and the
                             reward; a feature may drop rows (e.g. over-sampling's unfinished groups)
    after_generate(batch, timing)   the sampled responses are in the batch (before the reward)
    after_advantage(batch, metrics) advantages and returns are in the batch (before the updates)
    save(folder) / load(folder)     state kept across a checkpoint
"""

from __future__ import annotations

from typing import Any, Iterator

from rlpost.protocol import DataProto
from rlpost.utils.registry import Registry

STEP_FEATURES = Registry("step feature")


class StepFeature:
    """A feature of the PPO step; every hook's default does nothing.

    Args:
        trainer: the `RayPPOTrainer` whose step it joins (its config, worker groups and phase methods).
    """

    @classmethod
    def enabled_by(cls, config: Any) -> bool:
        """True when the config turns the feature on by itself (beyond an estimator asking for it)."""
        return False

    # True when the feature generates and scores the step's batch itself (`generate_scored`).
    generates_scored = False

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer

    def batches(self, loader: Iterator[dict]) -> Iterator[dict]:
        """The step's prompt batches, drawn from `loader` (the feature may add batches between them)."""
        yield from loader

    def generate_scored(self, batch: DataProto, more_batches: Iterator[dict] | None, timing: dict[str, float],
                        metrics: dict[str, Any]) -> tuple[DataProto, list[str]]:
        """Generate and score the step's batch (drawing further prompts from `more_batches` if it needs them);
        returns the scored batch and the names of the reward's extra per-row fields."""
        raise NotImplementedError(f"{type(self).__name__} sets generates_scored but has no generate_scored")

    def after_prepare(self, prompts: DataProto) -> None:
        """The batch's prompts with their uids, before they are repeated `rollout.n` times."""

    def after_rollout(self, batch: DataProto, metrics: dict[str, Any]) -> DataProto:
        """The generated batch (responses joined), before balancing and the reward; returns the rows to keep."""
        return batch

    def after_generate(self, prompts: DataProto, timing: dict[str, float]) -> None:
        """The responses are generated; `prompts` is the prepared batch they will join (add fields to it)."""

    def after_advantage(self, batch: DataProto, metrics: dict[str, Any]) -> None:
        """Advantages and returns are in `batch`, before the updates (add metrics, reorder rows)."""

    def save(self, folder: str) -> None:
        """Write the feature's state into the checkpoint `folder`."""

    def load(self, folder: str) -> None:
        """Read the feature's state back from the checkpoint `folder`."""


def register_step_feature(name: str):
    """Decorator registering a `StepFeature` subclass under `name`."""
    return STEP_FEATURES.register(name)


def active_features(trainer: Any) -> list[StepFeature]:
    """The features of `trainer`'s run: those its estimator declares, then those its config turns on."""
    from rlpost.algos.advantages import estimator_needs

    config = trainer.config
    wanted = list(estimator_needs(config.algorithm.adv_estimator).step_features)
    wanted += [n for n in STEP_FEATURES.names() if n not in wanted and STEP_FEATURES.get(n).enabled_by(config)]
    return [STEP_FEATURES.get(name)(trainer) for name in wanted]
