"""DAPO's dynamic sampling as a step feature, on the driver without Ray: groups kept until the step has enough,
trimmed to exactly `data.train_batch_size`, and the two ways it stops. The trainer is a stand-in carrying only what
the feature reads (its config and `_generate_and_score`)."""

import itertools
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from rlpost import keys as K
from rlpost.protocol import DataProto
from rlpost.trainer.ppo.dynamic_sampling import DataExhausted
from rlpost.trainer.ppo.features.dynamic_sampling import DynamicSampling

pytestmark = pytest.mark.timeout(60)

N = 2  # responses per prompt


def _prompts(n_prompts: int) -> dict:
    return {K.INPUT_IDS: torch.zeros(n_prompts, 3, dtype=torch.long)}


def test_enabled_by_the_config_key():
    on = OmegaConf.create({"algorithm": {"filter_groups": {"enable": True}}})
    off = OmegaConf.create({"algorithm": {"filter_groups": {"enable": False}}})
    assert DynamicSampling.enabled_by(on) and not DynamicSampling.enabled_by(off)
    assert DynamicSampling.generates_scored


class ScriptedRollouts:
    """Stands in for gen + reward: call i gives every prompt's n responses the scores `script[i][prompt]`."""

    def __init__(self, script: list[list[tuple[float, ...]]]):
        self.script, self.calls, self.uids = script, 0, itertools.count()

    def __call__(self, batch: DataProto, timing: dict) -> tuple[DataProto, list[str]]:
        scores = self.script[self.calls]
        self.calls += 1
        batch.non_tensor_batch[K.UID] = np.array([f"u{next(self.uids)}" for _ in range(len(batch))], dtype=object)
        batch = batch.repeat(N, interleave=True)
        per_row = torch.tensor([s for group in scores for s in group], dtype=torch.float32)
        batch.batch[K.TOKEN_LEVEL_SCORES] = torch.stack([torch.zeros_like(per_row), per_row], dim=1)  # (B, R=2)
        batch.non_tensor_batch["acc"] = np.array([s > 0 for s in per_row.tolist()], dtype=object)
        return batch, ["acc"]


def _filtering_trainer(script, train_batch_size: int, max_num_gen_batches: int = 10, metric: str = "seq_reward"):
    config = OmegaConf.create({"data": {"train_batch_size": train_batch_size, "gen_batch_size": 2},
                               "algorithm": {"filter_groups": {"enable": True, "metric": metric,
                                                               "max_num_gen_batches": max_num_gen_batches}}})
    return SimpleNamespace(config=config, _generate_and_score=ScriptedRollouts(script))


def _generate_scored(trainer, batch, more, metrics):
    return DynamicSampling(trainer).generate_scored(batch, more, {}, metrics)


def test_filter_groups_accumulates_then_trims_to_train_batch_size():
    # 2 prompts per generation batch; groups u0..u7. Varied groups: u1 | u3 | u4, u5 | (never reached)
    script = [[(1, 1), (0, 1)], [(0, 0), (1, 0)], [(0, 2), (3, 1)], [(0, 1), (0, 1)]]
    trainer = _filtering_trainer(script, train_batch_size=3)
    metrics: dict = {}
    more = iter([_prompts(2), _prompts(2), _prompts(2)])
    batch, reward_keys = _generate_scored(trainer, DataProto.from_single_dict(_prompts(2)), more, metrics)
    assert reward_keys == ["acc"]
    assert list(batch.non_tensor_batch[K.UID]) == ["u1", "u1", "u3", "u3", "u4", "u4"]  # u5 trimmed
    assert batch.batch[K.TOKEN_LEVEL_SCORES][:, 1].tolist() == [0.0, 1.0, 1.0, 0.0, 0.0, 2.0]
    assert metrics == {"training/num_gen_batches": 3, "training/filter_groups_kept_fraction": 4 / 6}
    assert next(more, None) is not None  # one batch of prompts left unread


def test_filter_groups_by_reward_extra_info():
    script = [[(0, 1), (2, 3)]]  # by score both vary; by acc (score > 0) only the first does
    trainer = _filtering_trainer(script, train_batch_size=1, metric="acc")
    batch, _ = _generate_scored(trainer, DataProto.from_single_dict(_prompts(2)), None, {})
    assert list(batch.non_tensor_batch[K.UID]) == ["u0", "u0"]


def test_filter_groups_gives_up_after_max_num_gen_batches():
    trainer = _filtering_trainer([[(1, 1), (0, 0)]] * 3, train_batch_size=2, max_num_gen_batches=3)
    more = iter([_prompts(2)] * 5)
    with pytest.raises(RuntimeError, match=r"3 generation batches \(algorithm.filter_groups.max_num_gen_batches=3\)"
                                           r".*kept 0 groups.*data.train_batch_size=2"):
        _generate_scored(trainer, DataProto.from_single_dict(_prompts(2)), more, {})
    assert trainer._generate_and_score.calls == 3


def test_filter_groups_running_out_of_prompts_stops_training():
    trainer = _filtering_trainer([[(1, 1), (0, 0)]] * 2, train_batch_size=2)
    with pytest.raises(DataExhausted):
        _generate_scored(trainer, DataProto.from_single_dict(_prompts(2)), iter([_prompts(2)]), {})
