"""verl's DataProto-level helpers of `ray_trainer` (what a recipe's own `fit()` calls), on hand-worked batches."""

import numpy as np
import pytest
import torch

from rlpost import keys as K
from rlpost.protocol import DataProto
from rlpost.trainer.ppo.core_algos import FixedKLController
from rlpost.trainer.ppo.ray_trainer import apply_kl_penalty, compute_advantage, compute_response_mask

pytestmark = pytest.mark.timeout(60)


def _batch(scores: list[float]) -> DataProto:
    """Rows of 1 prompt token and 2 response tokens, the second response token padding in row 1."""
    n = len(scores)
    attention = torch.ones(n, 3, dtype=torch.long)
    attention[1, 2] = 0
    rewards = torch.zeros(n, 2)
    rewards[:, 0] = torch.tensor(scores)
    return DataProto.from_dict(
        tensors={K.RESPONSES: torch.ones(n, 2, dtype=torch.long), K.ATTENTION_MASK: attention,
                 K.TOKEN_LEVEL_REWARDS: rewards},
        non_tensors={K.UID: np.array(["a", "a", "b", "b"], dtype=object)})


def test_compute_advantage_takes_and_returns_the_batch_as_in_verl():
    data = _batch([1.0, 0.0, 1.0, 1.0])
    out = compute_advantage(data, adv_estimator="grpo", num_repeat=2, norm_adv_by_std_in_grpo=True)
    assert out is data
    # the mask comes from the attention mask's response part (row 1: one valid token)
    assert data.batch[K.RESPONSE_MASK].tolist() == [[1, 1], [1, 0], [1, 1], [1, 1]]
    # group a: scores 1, 0 -> mean 0.5, unbiased std 0.5 * sqrt(2); group b: equal scores -> 0
    a = 0.5 / (0.5 * 2 ** 0.5 + 1e-6)
    expected = torch.tensor([[a, a], [-a, 0.0], [0.0, 0.0], [0.0, 0.0]])
    torch.testing.assert_close(data.batch[K.ADVANTAGES], expected)
    torch.testing.assert_close(data.batch[K.RETURNS], expected)


def test_apply_kl_penalty_writes_the_rewards_and_returns_the_metrics():
    data = _batch([1.0, 0.0, 1.0, 1.0])
    data.batch[K.RESPONSE_MASK] = compute_response_mask(data)
    data.batch[K.TOKEN_LEVEL_SCORES] = data.batch.pop(K.TOKEN_LEVEL_REWARDS)
    data.batch[K.OLD_LOG_PROBS] = torch.tensor([[0.0, -1.0]] * 4)
    data.batch[K.REF_LOG_PROB] = torch.tensor([[-0.5, -0.5]] * 4)
    out, metrics = apply_kl_penalty(data, kl_ctrl=FixedKLController(kl_coef=0.1), kl_penalty="kl")
    assert out is data
    # k1 = old - ref = [0.5, -0.5] per row, zeroed on padding (row 1's second token); beta 0.1
    expected = data.batch[K.TOKEN_LEVEL_SCORES] - 0.1 * torch.tensor([[0.5, -0.5], [0.5, 0.0], [0.5, -0.5],
                                                                       [0.5, -0.5]])
    torch.testing.assert_close(data.batch[K.TOKEN_LEVEL_REWARDS], expected)
    # per-row token means 0, 0.5, 0, 0 -> batch KL 0.125
    assert metrics == {"actor/reward_kl_penalty": pytest.approx(0.125), "actor/reward_kl_penalty_coeff": 0.1}
