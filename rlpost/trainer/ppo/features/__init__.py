"""Step features: what an estimator or option adds to the PPO step, one module each (see `base`)."""

from rlpost.trainer.ppo.features import (  # noqa: F401  (registers them)
    codapo,
    distillation,
    dynamic_sampling,
    gdpo,
    over_sampling,
    pf_ppo,
    remax,
    rollout_skip,
)
from rlpost.trainer.ppo.features.base import STEP_FEATURES, StepFeature, active_features, register_step_feature

__all__ = ["STEP_FEATURES", "StepFeature", "active_features", "register_step_feature"]
