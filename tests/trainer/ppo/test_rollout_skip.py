"""Rollout skip's saved batch: its name (verl's: experiment, project, batch size, rollout.n), the refusals before
Ray, and a saved file that does not fit the run (another batch size, longer responses, not rlpost's) named with
its path. (The step itself, saving and loading through main_ppo: test_ppo_e2e.py.)"""

import pickle
from types import SimpleNamespace

import pytest
import torch

from _compose import SMALL, typed_config_of
from rlpost import keys as K
from rlpost.protocol import DataProto
from rlpost.trainer.config import ConfigError
from rlpost.trainer.ppo.features.rollout_skip import REWARD_KEYS, RolloutSkip, dump_path

ARR = "actor_rollout_ref"


def _feature(tmp_path, *overrides):
    config = typed_config_of(*SMALL, f"{ARR}.rollout.name=hf", f"{ARR}.rollout.skip_rollout=true",
                             f"{ARR}.rollout.skip_dump_dir={tmp_path}", *overrides)
    return RolloutSkip(SimpleNamespace(config=config, features=[], global_steps=1)), config


def _save(path, rows, width, meta=True):
    batch = DataProto.from_dict({K.RESPONSES: torch.zeros(rows, width, dtype=torch.long)},
                                meta_info={REWARD_KEYS: []} if meta else {})
    path.write_bytes(pickle.dumps(batch))


@pytest.mark.timeout(60)
def test_the_saved_batch_is_named_as_verl_names_it(tmp_path):
    feature, config = _feature(tmp_path, "trainer.experiment_name=exp", "trainer.project_name=proj")
    n, gbs = config.actor_rollout_ref.rollout.n, config.data.train_batch_size
    assert dump_path(config) == feature.path == tmp_path / f"exp_proj_GBS{gbs}__N{n}.rlpost.pkl"


@pytest.mark.timeout(60)
def test_a_saved_file_that_does_not_fit_is_named(tmp_path):
    feature, config = _feature(tmp_path)
    rows, width = config.data.train_batch_size * config.actor_rollout_ref.rollout.n, config.data.max_response_length
    _save(feature.path, rows, width)
    assert len(feature._load(rows)) == rows
    _save(feature.path, rows + 2, width)
    with pytest.raises(ValueError, match=f"{feature.path} holds {rows + 2} rows"):
        feature._load(rows)
    _save(feature.path, rows, width + 1)
    with pytest.raises(ValueError, match=f"responses of up to {width + 1} tokens"):
        feature._load(rows)
    _save(feature.path, rows, width, meta=False)
    with pytest.raises(ValueError, match="is not a batch rlpost saved"):
        feature._load(rows)
    feature.path.write_bytes(b"not a pickle")
    with pytest.raises(ValueError, match="does not load"):
        feature._load(rows)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("extra, message", [
    (["algorithm.filter_groups.enable=true", "algorithm.adv_estimator=grpo"], "dynamic sampling"),
    ([f"{ARR}.rollout.over_sample_rate=0.1", f"{ARR}.rollout.mode=async", "data.gen_batch_size=16"], "over-sampling"),
])
def test_refused_beside_another_way_of_building_the_batch(tmp_path, extra, message):
    with pytest.raises(ConfigError, match=message):
        _feature(tmp_path, *extra)
