"""PF-PPO resampling weights and draws."""

from types import SimpleNamespace

import pytest
import torch

from rlpost import keys
from rlpost import algos as ca
from rlpost.algos.pf_ppo import pf_ppo_weights


def _close(actual, expected, atol=1e-5):
    # torch.allclose rather than torch.testing.assert_close: the latter costs seconds on first use
    expected = torch.as_tensor(expected, dtype=actual.dtype)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert torch.allclose(actual, expected, atol=atol, rtol=0), (actual, expected)


def test_pf_ppo_weights():
    _close(pf_ppo_weights(torch.tensor([1.0, -2.0, 0.0]), "pow", 2.0), [1.0, 4.0, 0.0])
    _close(pf_ppo_weights(torch.tensor([1.0, 3.0, 2.0, 3.0]), "max_min"), [1.0, 1.0, 0.0, 1.0])
    _close(pf_ppo_weights(torch.tensor([1.0, 3.0, 2.0]), "max_random"), [0.1, 0.4, 0.1])
    with pytest.raises(ValueError, match="reweight_method='best' is invalid"):
        pf_ppo_weights(torch.tensor([1.0]), "best")


def test_pf_ppo_sample_indices():
    gen = torch.Generator().manual_seed(0)
    idx = ca.pf_ppo_sample_indices(torch.tensor([1.0, 3.0, 2.0, 3.0] * 8), "max_min", generator=gen)
    assert idx.dtype == torch.long and idx.shape == (32,)
    assert set((idx % 4).tolist()) <= {0, 1, 3}  # rows with score 2 have weight 0
    uniform = ca.pf_ppo_sample_indices(torch.zeros(6), "pow", generator=gen)  # all weights 0 -> uniform
    assert uniform.shape == (6,) and int(uniform.min()) >= 0 and int(uniform.max()) <= 5


def test_compute_pf_ppo_reweight_data_uses_sequence_scores():
    picked = {}
    data = SimpleNamespace(
        batch={keys.TOKEN_LEVEL_SCORES: torch.tensor([[0.0, 0.0], [0.0, 1.0], [2.0, 0.0]])},
        select_idxs=lambda idx: picked.setdefault("idx", idx),
    )
    out = ca.compute_pf_ppo_reweight_data(data, "pow", 1.0, generator=torch.Generator().manual_seed(0))
    assert out is picked["idx"] and out.shape == (3,)
    assert 0 not in out.tolist()  # row 0 scores 0 -> weight 0
