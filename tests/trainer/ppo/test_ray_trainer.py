"""`RayPPOTrainer` phases on the driver, without Ray: rollout correction, bypass mode, and the group trimming
helper of dynamic sampling. The trainer is a stand-in object carrying only what a phase reads."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from rlpost import keys as K
from rlpost.protocol import DataProto
from rlpost.trainer.ppo.dynamic_sampling import first_groups
from rlpost.trainer.ppo.ray_trainer import RayPPOTrainer

N = 2  # responses per prompt


def _prompts(n_prompts: int) -> dict:
    return {K.INPUT_IDS: torch.zeros(n_prompts, 3, dtype=torch.long)}


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
