"""An estimator with a side need, added in one file: a group-mean baseline (each response's score minus its
prompt group's mean, no std scaling) that also logs the share of groups whose responses all scored the same.
Registering the estimator with its needs and its step feature is all it takes: the config accepts the name,
start-up warns on rollout.n=1 (it declares groups), the trainer runs its feature after the advantages."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from _compose import SMALL, compose_config
from rlpost import keys as K
from rlpost.algos import advantages
from rlpost.algos.advantages import EstimatorNeeds, register_adv_est
from rlpost.protocol import DataProto
from rlpost.trainer.config.errors import ConfigWarning
from rlpost.trainer.ppo.features import STEP_FEATURES, StepFeature, active_features, register_step_feature

pytestmark = pytest.mark.timeout(60)


def group_mean_baseline(token_level_rewards, response_mask, index, **kwargs):
    scores = token_level_rewards.sum(-1)
    _, group = np.unique(np.asarray(index), return_inverse=True)
    group = torch.as_tensor(group)
    means = torch.zeros(int(group.max()) + 1).index_add_(0, group, scores) / torch.bincount(group).float()
    adv = (scores - means[group])[:, None] * response_mask
    return adv, adv


class FlatGroupShare(StepFeature):
    def after_advantage(self, batch, metrics):
        uids, scores = batch.non_tensor_batch[K.UID], batch.batch[K.TOKEN_LEVEL_SCORES].sum(-1)
        flat = [float(scores[uids == u].std(unbiased=False)) == 0.0 for u in set(uids)]
        metrics["flat_group_share"] = sum(flat) / len(flat)


@pytest.fixture(autouse=True)
def registered():
    """What the file's user writes at import (`@register_adv_est(...)`, `@register_step_feature(...)`), undone
    after each test so that no other test sees a name outside the built-ins."""
    register_adv_est("group_mean_baseline", EstimatorNeeds(groups=True, step_features=("flat_group_share",)))(
        group_mean_baseline)
    register_step_feature("flat_group_share")(FlatGroupShare)
    yield
    for table in (advantages.ADV_ESTIMATORS._entries, advantages._NEEDS):
        table.pop("group_mean_baseline")
    STEP_FEATURES._entries.pop("flat_group_share")


def test_the_config_takes_it_and_start_up_reads_its_needs():
    cfg = compose_config(*SMALL, "algorithm.adv_estimator=group_mean_baseline", "actor_rollout_ref.rollout.n=2")
    assert cfg.algorithm.adv_estimator == "group_mean_baseline"
    with pytest.warns(ConfigWarning, match="group_mean_baseline compares the responses of one prompt"):
        compose_config(*SMALL, "algorithm.adv_estimator=group_mean_baseline", "actor_rollout_ref.rollout.n=1")


def test_the_trainer_runs_its_feature_and_the_estimator_gives_hand_values():
    from rlpost.trainer.ppo.core_algos import compute_advantage

    trainer = SimpleNamespace(config=SimpleNamespace(algorithm=SimpleNamespace(
        adv_estimator="group_mean_baseline", use_pf_ppo=False, filter_groups=SimpleNamespace(enable=False)),
        distillation=SimpleNamespace(enabled=False),
        actor_rollout_ref=SimpleNamespace(rollout=SimpleNamespace(over_sample_rate=0.0, skip_rollout=False))))
    features = active_features(trainer)
    assert [type(f) for f in features] == [FlatGroupShare]
    scores = torch.tensor([[1.0], [0.0], [1.0], [1.0]])
    uids = np.array(["a", "a", "b", "b"], dtype=object)
    adv, _ = compute_advantage(scores, torch.ones(4, 1), "group_mean_baseline", index=uids)
    assert adv[:, 0].tolist() == [0.5, -0.5, 0.0, 0.0]
    batch = DataProto.from_dict(tensors={K.TOKEN_LEVEL_SCORES: scores}, non_tensors={K.UID: uids})
    metrics = {}
    features[0].after_advantage(batch, metrics)
    assert metrics == {"flat_group_share": 0.5}
