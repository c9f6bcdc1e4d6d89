"""`RayPPOTrainer` phases on the driver, without Ray: dynamic sampling (filter_groups), rollout correction,
bypass mode, and the group trimming helper. The trainer is a stand-in object carrying only what a phase reads."""

import itertools
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from rlpost import keys as K
from rlpost.protocol import DataProto
from rlpost.trainer.ppo.ray_trainer import DataExhausted, RayPPOTrainer, first_groups

N = 2  # responses per prompt


def _prompts(n_prompts: int) -> dict:
    return {K.INPUT_IDS: torch.zeros(n_prompts, 3, dtype=torch.long)}


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
    config = OmegaConf.create({"data": {"train_batch_size": train_batch_size, "gen_batch_size": 2}})
    algo = OmegaConf.create({"filter_groups": {"enable": True, "metric": metric,
                                               "max_num_gen_batches": max_num_gen_batches}})
    return SimpleNamespace(config=config, algo=algo, _generate_and_score=ScriptedRollouts(script))


def test_filter_groups_accumulates_then_trims_to_train_batch_size():
    # 2 prompts per generation batch; groups u0..u7. Varied groups: u1 | u3 | u4, u5 | (never reached)
    script = [[(1, 1), (0, 1)], [(0, 0), (1, 0)], [(0, 2), (3, 1)], [(0, 1), (0, 1)]]
    trainer = _filtering_trainer(script, train_batch_size=3)
    metrics: dict = {}
    more = iter([_prompts(2), _prompts(2), _prompts(2)])
    batch, reward_keys = RayPPOTrainer._generate_filtered(
        trainer, DataProto.from_single_dict(_prompts(2)), more, {}, metrics)
    assert reward_keys == ["acc"]
    assert list(batch.non_tensor_batch[K.UID]) == ["u1", "u1", "u3", "u3", "u4", "u4"]  # u5 trimmed
    assert batch.batch[K.TOKEN_LEVEL_SCORES][:, 1].tolist() == [0.0, 1.0, 1.0, 0.0, 0.0, 2.0]
    assert metrics == {"training/num_gen_batches": 3, "training/filter_groups_kept_fraction": 4 / 6}
    assert next(more, None) is not None  # one batch of prompts left unread


def test_filter_groups_by_reward_extra_info():
    script = [[(0, 1), (2, 3)]]  # by score both vary; by acc (score > 0) only the first does
    trainer = _filtering_trainer(script, train_batch_size=1, metric="acc")
    batch, _ = RayPPOTrainer._generate_filtered(trainer, DataProto.from_single_dict(_prompts(2)), None, {}, {})
    assert list(batch.non_tensor_batch[K.UID]) == ["u0", "u0"]


def test_filter_groups_gives_up_after_max_num_gen_batches():
    trainer = _filtering_trainer([[(1, 1), (0, 0)]] * 3, train_batch_size=2, max_num_gen_batches=3)
    more = iter([_prompts(2)] * 5)
    with pytest.raises(RuntimeError, match=r"3 generation batches \(algorithm.filter_groups.max_num_gen_batches=3\)"
                                           r".*kept 0 groups.*data.train_batch_size=2"):
        RayPPOTrainer._generate_filtered(trainer, DataProto.from_single_dict(_prompts(2)), more, {}, {})
    assert trainer._generate_and_score.calls == 3


def test_filter_groups_running_out_of_prompts_stops_training():
    trainer = _filtering_trainer([[(1, 1), (0, 0)]] * 2, train_batch_size=2)
    with pytest.raises(DataExhausted):
        RayPPOTrainer._generate_filtered(trainer, DataProto.from_single_dict(_prompts(2)), iter([_prompts(2)]),
                                         {}, {})


def test_first_groups_keeps_whole_groups_in_order():
    data = DataProto.from_dict({K.VALUES: torch.arange(6.0)}, {K.UID: np.array(list("aabbcc"), dtype=object)})
    out = first_groups(data, 2)
    assert out.batch[K.VALUES].tolist() == [0.0, 1.0, 2.0, 3.0]


def _correction_cfg(**overrides):
    cfg = {"rollout_is": None, "rollout_is_threshold": 2.0, "rollout_is_batch_normalize": False, "rollout_rs": None,
           "rollout_rs_threshold": None, "rollout_rs_threshold_lower": None, "rollout_token_veto_threshold": None,
           "bypass_mode": False, "loss_type": "ppo_clip"}
    cfg.update(overrides)
    return SimpleNamespace(algo=OmegaConf.create({"rollout_correction": cfg}))


def _logprob_batch(with_rollout: bool = True) -> DataProto:
    old = torch.log(torch.tensor([[0.5, 0.5, 0.5], [0.5, 0.5, 0.5]]))
    rollout = torch.log(torch.tensor([[0.5, 0.1, 0.5], [0.4, 0.5, 0.9]]))  # ratios 1, 5, 1 | 1.25, 1, 0.56
    tensors = {K.OLD_LOG_PROBS: old, K.RESPONSE_MASK: torch.tensor([[1, 1, 1], [1, 1, 0]])}
    if with_rollout:
        tensors[K.ROLLOUT_LOG_PROBS] = rollout
    return DataProto.from_dict(tensors)


def test_rollout_correction_puts_weights_and_rejection_into_the_batch():
    trainer = _correction_cfg(rollout_is="token", rollout_rs="token", rollout_rs_threshold=3.0)
    batch, metrics = _logprob_batch(), {}
    RayPPOTrainer._apply_rollout_correction(trainer, batch, metrics)
    # token ratio 5 is outside [1/3, 3]: rejected; the padding token stays out of the mask
    assert batch.batch[K.RESPONSE_MASK].tolist() == [[1, 0, 1], [1, 1, 0]]
    torch.testing.assert_close(batch.batch[K.ROLLOUT_IS_WEIGHTS], torch.tensor([[1.0, 0.0, 1.0], [1.25, 1.0, 0.0]]))
    assert metrics["rollout_corr/rejected_frac"] == pytest.approx(1 / 5)


def test_rejection_only_adds_no_weights():
    trainer = _correction_cfg(rollout_rs="token", rollout_rs_threshold=3.0)
    batch = _logprob_batch()
    RayPPOTrainer._apply_rollout_correction(trainer, batch, {})
    assert K.ROLLOUT_IS_WEIGHTS not in batch.batch and batch.batch[K.RESPONSE_MASK].sum() == 4


def test_missing_rollout_log_probs_names_the_setting():
    with pytest.raises(RuntimeError, match="actor_rollout_ref.rollout.calculate_log_probs=true"):
        RayPPOTrainer._apply_rollout_correction(_correction_cfg(rollout_is="token"), _logprob_batch(False), {})


def test_bypass_mode_uses_rollout_log_probs_as_old_policy():
    trainer = _correction_cfg(rollout_is="token", bypass_mode=True)
    batch = _logprob_batch()
    RayPPOTrainer._compute_old_log_prob(trainer, batch, {})  # no actor_rollout_wg: no worker call is made
    assert torch.equal(batch.batch[K.OLD_LOG_PROBS], batch.batch[K.ROLLOUT_LOG_PROBS])
