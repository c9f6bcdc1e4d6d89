"""KL estimators, controllers and the in-reward KL penalty against hand-computed examples."""

import math
from types import SimpleNamespace

import pytest
import torch

from rlpost import algos as ca


def _close(actual, expected, atol=1e-5):
    # torch.allclose rather than torch.testing.assert_close: the latter costs seconds on first use
    expected = torch.as_tensor(expected, dtype=actual.dtype)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert torch.allclose(actual, expected, atol=atol, rtol=0), (actual, expected)


LOGP = torch.tensor([[-1.0, -2.0]])
REF = torch.tensor([[-1.5, -1.0]])  # d = logp - ref = [0.5, -1.0]


K1 = [0.5, -1.0]
K2 = [0.5 * 0.25, 0.5 * 1.0]
K3 = [math.exp(-0.5) + 0.5 - 1, math.exp(1.0) - 1.0 - 1]


@pytest.mark.parametrize(
    "name,expected",
    [("kl", K1), ("k1", K1), ("abs", [0.5, 1.0]), ("mse", K2), ("k2", K2), ("low_var_kl", K3), ("k3", K3)],
)
def test_kl_estimators(name, expected):
    _close(ca.kl_penalty(LOGP, REF, name), [expected])
    # the '+' form has the same forward value
    _close(ca.kl_penalty(LOGP, REF, name + "+"), [expected])


def test_kl_estimator_names_list_every_valid_config_value():
    base = ["abs", "full", "k1", "k2", "k3", "kl", "low_var_kl", "mse"]
    assert ca.KL_ESTIMATORS.names() == base
    assert ca.kl_estimator_names() == base + [b + "+" for b in base]


def test_low_var_kl_is_clamped():
    # d = -20 -> exp(20) - 20 - 1 ~ 4.85e8 -> clamped to 10; d = 30 -> log-ratio clamped to -20 -> 19 -> 10
    out = ca.kl_penalty(torch.tensor([-21.0, 0.0]), torch.tensor([-1.0, -30.0]), "low_var_kl")
    _close(out, [10.0, 10.0])


def test_straight_through_value_and_gradient():
    logp = LOGP.clone().requires_grad_(True)
    out = ca.kl_penalty(logp, REF, "low_var_kl+")
    _close(out.detach(), [[math.exp(-0.5) + 0.5 - 1, math.exp(1.0) - 2]])
    out.sum().backward()
    _close(logp.grad, [[0.5, -1.0]])  # gradient of 0.5 * d^2 is d


def test_full_kl_on_distributions():
    p = torch.log(torch.tensor([[[0.5, 0.5]]]))
    q = torch.log(torch.tensor([[[0.25, 0.75]]]))
    _close(ca.kl_penalty(p, q, "full"), [[0.5 * math.log(2.0) + 0.5 * math.log(0.5 / 0.75)]])
    with pytest.raises(ValueError, match="needs full log-distributions"):
        ca.kl_penalty(LOGP, REF, "full")
    # the exact KL already has the exact gradient: 'full+' is 'full'
    _close(ca.kl_penalty(p, q, "full+"), ca.kl_penalty(p, q, "full"))
    with pytest.raises(ValueError, match="Unknown kl_penalty 'k9'.*'low_var_kl\\+'"):
        ca.kl_penalty(LOGP, REF, "k9")
    with pytest.raises(ValueError, match="Did you mean 'low_var_kl'"):
        ca.kl_penalty(LOGP, REF, "low_var_k")


def test_kl_controllers():
    fixed = ca.get_kl_controller(SimpleNamespace(type="fixed", kl_coef=0.1, target_kl=0.1, horizon=10))
    fixed.update(current_kl=5.0, n_steps=100)
    assert fixed.value == 0.1
    ctrl = ca.get_kl_controller(SimpleNamespace(type="adaptive", kl_coef=0.1, target_kl=0.5, horizon=100))
    ctrl.update(current_kl=1.0, n_steps=10)  # error clip(2 - 1) = 0.2 -> x (1 + 0.2 * 10/100)
    assert ctrl.value == pytest.approx(0.1 * 1.02)
    ctrl.update(current_kl=0.45, n_steps=10)  # error 0.9 - 1 = -0.1 -> x (1 - 0.1 * 0.1)
    assert ctrl.value == pytest.approx(0.1 * 1.02 * 0.99)
    with pytest.raises(ValueError, match="kl_ctrl.type='linear' is invalid"):
        ca.get_kl_controller(SimpleNamespace(type="linear", kl_coef=0.1))
    with pytest.raises(ValueError, match="horizon must be > 0"):
        ca.AdaptiveKLController(0.1, 0.5, 0)


def test_apply_kl_penalty():
    scores = torch.tensor([[0.0, 1.0], [0.0, 2.0]])
    old = torch.full((2, 2), -1.0)
    ref = torch.tensor([[-1.5, -1.5], [-0.5, -0.5]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    ctrl = ca.AdaptiveKLController(init_kl_coef=0.1, target_kl=0.1, horizon=10)
    rewards, metrics = ca.apply_kl_penalty(scores, old, ref, mask, ctrl, "kl")
    # kl = old - ref masked = [[0.5, 0.5], [-0.5, 0]]; rewards = scores - 0.1 * kl
    _close(rewards, [[-0.05, 0.95], [0.05, 2.0]])
    # row means 0.5 and -0.5 -> batch KL 0; coefficient reported before the update
    assert metrics["actor/reward_kl_penalty"] == pytest.approx(0.0)
    assert metrics["actor/reward_kl_penalty_coeff"] == pytest.approx(0.1)
    assert ctrl.value == pytest.approx(0.1 * (1 - 0.2 * 2 / 10))  # error clip(0/0.1 - 1) = -0.2, n_steps = 2
