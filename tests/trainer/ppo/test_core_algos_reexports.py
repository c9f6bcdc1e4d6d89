"""`rlpost.trainer.ppo.core_algos` keeps verl's import path: every `rlpost.algos` name, plus masked reductions."""

import torch

import rlpost.algos as algos
from rlpost.trainer.ppo import core_algos as ca

# Every public name core_algos exported before the algorithms moved to rlpost.algos.
OLD_NAMES = [
    "ADV_ESTIMATORS", "AdvantageEstimator", "compute_advantage", "compute_gae_advantage_return",
    "compute_gpg_outcome_advantage", "compute_grpo_outcome_advantage", "compute_opo_outcome_advantage",
    "compute_reinforce_plus_plus_baseline_outcome_advantage", "compute_reinforce_plus_plus_outcome_advantage",
    "compute_remax_outcome_advantage", "compute_rloo_outcome_advantage", "get_adv_estimator_fn",
    "register_adv_est", "AdaptiveKLController", "FixedKLController", "apply_kl_penalty", "get_kl_controller",
    "kl_penalty", "entropy_from_logits", "entropy_from_logits_with_chunking", "logprobs_from_logits",
    "LOSS_AGG_MODES", "POLICY_LOSSES", "agg_loss", "compute_policy_loss", "compute_policy_loss_gpg",
    "compute_policy_loss_gspo", "compute_policy_loss_vanilla", "compute_value_loss", "get_policy_loss_fn",
    "register_policy_loss", "compute_pf_ppo_reweight_data", "pf_ppo_sample_indices", "masked_mean",
    "masked_sum", "masked_var", "masked_whiten",
]


def test_core_algos_reexports_old_and_new_names():
    assert set(OLD_NAMES) <= set(ca.__all__)
    assert set(algos.__all__) <= set(ca.__all__)
    for name in ca.__all__:
        assert hasattr(ca, name), name
    for name in algos.__all__:
        assert getattr(ca, name) is getattr(algos, name), name
    assert ca.get_policy_loss_fn("sapo") is algos.compute_policy_loss_sapo
    assert ca.get_adv_estimator_fn("grpo_passk") is algos.compute_grpo_passk_outcome_advantage


def _close(actual, expected, atol=1e-5):
    # torch.allclose rather than torch.testing.assert_close: the latter costs seconds on first use
    expected = torch.as_tensor(expected, dtype=actual.dtype)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert torch.allclose(actual, expected, atol=atol, rtol=0), (actual, expected)


def test_masked_reductions_ignore_masked_garbage():
    values = torch.tensor([1.0, 2.0, 3.0, float("nan")])
    mask = torch.tensor([1.0, 1.0, 1.0, 0.0])
    _close(ca.masked_sum(values, mask), 6.0)
    _close(ca.masked_mean(values, mask), 2.0)
    _close(ca.masked_var(values, mask), 1.0)  # ((-1)^2 + 0 + 1^2) / (3 - 1)
    _close(ca.masked_var(values, mask, unbiased=False), 2 / 3)
    _close(ca.masked_whiten(values, mask)[:3], [-1.0, 0.0, 1.0], atol=1e-4)
    _close(ca.masked_whiten(values, mask, shift_mean=False)[:3], [1.0, 2.0, 3.0], atol=1e-4)
    rows = torch.tensor([[1.0, 3.0], [5.0, 7.0]])
    _close(ca.masked_mean(rows, torch.tensor([[1.0, 1.0], [1.0, 0.0]]), axis=-1), [2.0, 5.0])
    _close(ca.masked_mean(rows, torch.zeros(2, 2)), 0.0)  # nothing valid: 0, not nan


def test_verl_registry_dicts_are_the_live_registries():
    assert ca.ADV_ESTIMATOR_REGISTRY["grpo"] is ca.compute_grpo_outcome_advantage
    assert ca.POLICY_LOSS_REGISTRY["vanilla"] is ca.compute_policy_loss_vanilla
    assert set(ca.ADV_ESTIMATOR_REGISTRY) == set(algos.ADV_ESTIMATORS.names())

    def mine(**kwargs):
        return None

    ca.POLICY_LOSS_REGISTRY["my_dict_loss"] = mine  # how verl-era code registers without the decorator
    try:
        assert ca.get_policy_loss_fn("my_dict_loss") is mine
    finally:
        del ca.POLICY_LOSS_REGISTRY["my_dict_loss"]
    assert "my_dict_loss" not in algos.POLICY_LOSSES
