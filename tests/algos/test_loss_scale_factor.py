"""`actor.loss_scale_factor`: the constant divisor of seq-mean-token-sum-norm reaches every built-in policy loss
through the typed actor config's `global_batch_info` (verl's spelling, so a loss written against verl's API
gets it too), the distillation term, and nothing else; values by hand."""

import pytest
import torch

from _compose import SMALL, typed_config_of
from rlpost import algos as ca
from rlpost.algos.distillation import distillation_loss
from rlpost.algos.losses import agg_loss, batch_info

ARR = "actor_rollout_ref.actor"
MASK = torch.tensor([[1.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]])  # R = 4
ADV = torch.tensor([[1.0, 2.0, 0.0, 0.0], [-3.0, 0.0, 0.0, 0.0]])


def _actor(*overrides: str):
    return typed_config_of(*SMALL, "actor_rollout_ref.rollout.name=hf", f"{ARR}.loss_agg_mode=seq-mean-token-sum-norm",
                           *overrides).actor_rollout_ref.actor


@pytest.mark.timeout(60)
def test_vanilla_divides_by_the_factor_not_the_mask_width():
    logp = torch.zeros(2, 4)  # ratio 1: per-token loss -A; row sums -3 and 3
    pg8, *_ = ca.get_policy_loss_fn("vanilla")(logp, logp, ADV, MASK, "seq-mean-token-sum-norm",
                                                 _actor(f"{ARR}.loss_scale_factor=8"))
    pg, *_ = ca.get_policy_loss_fn("vanilla")(logp, logp, ADV, MASK, "seq-mean-token-sum-norm", _actor())
    assert float(pg8) == pytest.approx((-3 / 8 + 3 / 8) / 2) and float(pg) == 0.0
    adv = torch.tensor([[1.0, 2.0, 0.0, 0.0], [5.0, 0.0, 0.0, 0.0]])
    pg8, *_ = ca.get_policy_loss_fn("vanilla")(logp, logp, adv, MASK, "seq-mean-token-sum-norm",
                                                 _actor(f"{ARR}.loss_scale_factor=8"))
    assert float(pg8) == pytest.approx((-3 / 8 - 5 / 8) / 2)  # row sums -3, -5 over 8, mean of the 2 rows


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", ["vanilla", "gspo", "gpg", "cispo", "clip_cov", "kl_cov", "sapo", "topr", "dro"])
def test_every_loss_that_aggregates_by_the_mode_scales_by_width_over_factor(name):
    g = torch.Generator().manual_seed(0)
    old = -torch.rand(2, 4, generator=g)
    new = old + 0.05 * torch.randn(2, 4, generator=g)
    adv = torch.randn(2, 4, generator=g)
    fn = ca.get_policy_loss_fn(name)
    extra = [f"{ARR}.policy_loss.loss_mode={name}"] + ([f"{ARR}.policy_loss.dro_beta=0.05"] if name == "dro" else [])
    plain, *_ = fn(old, new, adv, MASK, "seq-mean-token-sum-norm", _actor(*extra))
    scaled, *_ = fn(old, new, adv, MASK, "seq-mean-token-sum-norm", _actor(*extra, f"{ARR}.loss_scale_factor=16"))
    assert float(scaled) == pytest.approx(float(plain) * 4 / 16, rel=1e-5, abs=1e-7)


@pytest.mark.timeout(60)
def test_global_batch_info_holds_only_the_factor_and_other_modes_ignore_it():
    assert _actor().global_batch_info == {} and batch_info(None) == {} and batch_info({"a": 1}) == {}
    assert _actor(f"{ARR}.loss_scale_factor=8").global_batch_info == {"loss_scale_factor": 8.0}
    loss = torch.tensor([[1.0, 2.0, 0.0, 0.0], [5.0, 0.0, 0.0, 0.0]])
    assert float(agg_loss(loss, MASK, "token-mean", loss_scale_factor=8)) == pytest.approx(8 / 3)
    # the distillation term: per-token k1 = student - teacher = 1 on each valid token, rows 2 and 1 over 8
    student, teacher = torch.zeros(2, 4), -torch.ones(2, 4)
    d = distillation_loss(student, teacher, MASK, "k1", "seq-mean-token-sum-norm", loss_scale_factor=8)
    assert float(d) == pytest.approx((2 / 8 + 1 / 8) / 2)


@pytest.mark.timeout(60)
def test_bad_factor_is_refused_and_an_unread_one_warned():
    from rlpost.trainer.config import ConfigError, ConfigWarning

    with pytest.raises(ConfigError, match="loss_scale_factor"):
        _actor(f"{ARR}.loss_scale_factor=0")
    with pytest.warns(ConfigWarning, match="read only with actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum"):
        typed_config_of(*SMALL, "actor_rollout_ref.rollout.name=hf", f"{ARR}.loss_scale_factor=8")
