"""Which step features a run gets (from its estimator's declaration and its options), and what the
GDPO and PF-PPO features do to a batch (ReMax's and CoDaPO's are run by the e2e tests and test_codapo.py)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from rlpost import keys as K
from rlpost.protocol import DataProto
from rlpost.trainer.ppo.features import STEP_FEATURES, active_features
from rlpost.trainer.ppo.features.gdpo import GdpoMetrics
from rlpost.trainer.ppo.features.pf_ppo import PfPpo

pytestmark = pytest.mark.timeout(60)


def _trainer(estimator: str, use_pf_ppo: bool = False, distill: bool = False, filter_groups: bool = False,
             over_sample_rate: float = 0.0, skip_rollout: bool = False, **algo) -> SimpleNamespace:
    algo_cfg = SimpleNamespace(adv_estimator=estimator, use_pf_ppo=use_pf_ppo, codapo_top_k=None,
                               codapo_weight_offset=None, codapo_accuracy_key=None,
                               filter_groups=SimpleNamespace(enable=filter_groups), **algo)
    rollout = SimpleNamespace(rollout=SimpleNamespace(over_sample_rate=over_sample_rate, skip_rollout=skip_rollout))
    return SimpleNamespace(config=SimpleNamespace(algorithm=algo_cfg, distillation=SimpleNamespace(enabled=distill),
                                                  actor_rollout_ref=rollout))


@pytest.mark.parametrize("estimator, pf, want", [
    ("grpo", False, []), ("gae", False, []), ("remax", False, ["RemaxBaseline"]),
    ("gdpo", False, ["GdpoMetrics"]), ("codapo", False, ["CodapoFeature"]),
    ("grpo", True, ["PfPpo"]), ("gdpo", True, ["GdpoMetrics", "PfPpo"]),  # the estimator's first
])
def test_the_estimator_declares_its_features_and_options_add_theirs(estimator, pf, want):
    assert [type(f).__name__ for f in active_features(_trainer(estimator, pf))] == want


def test_dynamic_sampling_is_turned_on_by_filter_groups_and_generates_scored():
    features = active_features(_trainer("grpo", filter_groups=True))
    assert [type(f).__name__ for f in features] == ["DynamicSampling"]
    assert [f.generates_scored for f in active_features(_trainer("grpo", True))] == [False]


def test_rollout_skip_is_turned_on_by_its_key_and_generates_scored():
    from rlpost.trainer.ppo.features.rollout_skip import RolloutSkip

    assert RolloutSkip.enabled_by(_trainer("grpo", skip_rollout=True).config)
    assert not RolloutSkip.enabled_by(_trainer("grpo").config) and RolloutSkip.generates_scored


def test_over_sampling_is_turned_on_by_its_rate():
    assert [type(f).__name__ for f in active_features(_trainer("grpo", over_sample_rate=0.25))] == ["OverSampling"]


def test_registered_features():
    assert {"codapo_cycle", "distillation", "gdpo_metrics", "pf_ppo", "remax_baseline"} <= set(STEP_FEATURES.names())


def test_distillation_is_turned_on_by_its_key():
    assert [type(f).__name__ for f in active_features(_trainer("grpo", distill=True))] == ["Distillation"]
    assert [type(f).__name__ for f in active_features(_trainer("remax", True, True))] == \
        ["RemaxBaseline", "Distillation", "PfPpo"]


def test_gdpo_metrics_of_each_component():
    batch = DataProto.from_dict(tensors={K.RESPONSE_MASK: torch.ones(4, 1)},
                                non_tensors={"fmt": np.array([1.0, 0.0, 1.0, 1.0], dtype=object),
                                             "acc": np.array([0.0, 0.0, 1.0, 0.0], dtype=object)})
    metrics = {}
    GdpoMetrics(_trainer("gdpo", gdpo_reward_keys=["fmt", "acc"])).after_advantage(batch, metrics)
    assert metrics["gdpo/fmt/mean"] == pytest.approx(0.75) and metrics["gdpo/acc/max"] == 1.0
    assert metrics["gdpo/fmt/min"] == 0.0 and metrics["gdpo/acc/mean"] == pytest.approx(0.25)


def test_pf_ppo_resamples_only_rows_with_weight():
    scores = torch.tensor([[0.0, 0.0], [0.0, 1.0], [0.0, 0.0]])  # pow weights: row 1 alone has weight
    batch = DataProto.from_dict(tensors={K.TOKEN_LEVEL_SCORES: scores, K.RESPONSE_MASK: torch.ones(3, 2)},
                                non_tensors={K.UID: np.array(["a", "b", "c"], dtype=object)})
    trainer = _trainer("grpo", True, pf_ppo=SimpleNamespace(reweight_method="pow", weight_pow=2.0))
    PfPpo(trainer).after_advantage(batch, {})
    assert list(batch.non_tensor_batch[K.UID]) == ["b", "b", "b"]
    assert PfPpo.enabled_by(trainer.config) and not PfPpo.enabled_by(_trainer("grpo").config)
