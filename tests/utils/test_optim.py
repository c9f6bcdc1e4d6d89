"""AdamW + LR schedules from the composed `optim` group: warmup rule, constant and cosine values by hand,
and where the number of training steps comes from (an explicit argument, else optim.total_training_steps)."""

import math

import pytest
import torch

from _compose import SMALL, compose_config
from rlpost.trainer.config import ConfigWarning
from rlpost.utils.optim import (build_lr_scheduler, build_optimizer, cosine_lr_lambda, lr_schedule,
                                num_warmup_steps, resolve_total_steps)


def _optim(*overrides: str):
    """`actor_rollout_ref.actor.optim` of the default config with lr 1 and the given `optim.*` overrides."""
    keys = [f"actor_rollout_ref.actor.optim.{o}" for o in ("lr=1.0", *overrides)]
    return compose_config(*SMALL, "actor_rollout_ref.rollout.name=hf", *keys).actor_rollout_ref.actor.optim


def _sched(optim, total_training_steps):
    opt = build_optimizer([torch.nn.Parameter(torch.zeros(2))], optim)
    return opt, build_lr_scheduler(opt, optim, total_training_steps)


def _lrs(sched, opt, n):
    out = []
    for _ in range(n):
        out.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
    return out


def test_warmup_steps_negative_uses_ratio():
    assert num_warmup_steps(-1, 0.25, 20) == 5
    assert num_warmup_steps(3, 0.25, 20) == 3
    opt, sched = _sched(_optim("lr_warmup_steps_ratio=0.5"), 4)  # default lr_warmup_steps=-1: 2 of 4 steps
    assert _lrs(sched, opt, 3) == [0.0, 0.5, 1.0]


def test_constant_with_warmup():
    opt, sched = _sched(_optim("lr_warmup_steps=2", "lr_scheduler=constant"), 10)
    assert _lrs(sched, opt, 4) == [0.0, 0.5, 1.0, 1.0]


def test_cosine_reaches_min_ratio():
    opt, sched = _sched(_optim("lr_warmup_steps=0", "lr_scheduler=cosine", "min_lr_ratio=0.1"), 4)
    lrs = _lrs(sched, opt, 5)
    assert lrs[0] == pytest.approx(1.0)
    assert lrs[2] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert lrs[4] == pytest.approx(0.1)
    assert cosine_lr_lambda(1, 2, 10, 0.0, 0.5) == pytest.approx(0.5)


def test_total_steps_explicit_else_optim_key():
    default = _optim()
    assert default.total_training_steps == -1  # the YAML leaves it to the trainer
    assert resolve_total_steps(default, 7) == 7
    assert resolve_total_steps(default, None) == 0  # unknown: a constant schedule needs none
    assert resolve_total_steps(_optim("total_training_steps=5"), None) == 5
    assert resolve_total_steps(_optim("total_training_steps=5"), 8) == 8  # the explicit count wins
    opt, sched = _sched(_optim("lr_warmup_steps=0", "lr_scheduler=cosine", "total_training_steps=2"), None)
    assert _lrs(sched, opt, 3) == pytest.approx([1.0, 0.5, 0.0])
    with pytest.raises(ValueError, match="pass total_training_steps to the worker's init_model"):
        _sched(_optim("lr_scheduler=cosine"), None)


def test_deprecated_warmup_style_reaches_lr_scheduler():
    with pytest.warns(ConfigWarning, match="warmup_style is deprecated"):  # mapped at validation
        optim = _optim("warmup_style=cosine", "lr_warmup_steps=0", "min_lr_ratio=0.0")
    assert optim.lr_scheduler == "cosine"
    opt, sched = _sched(optim, 2)
    assert _lrs(sched, opt, 3) == pytest.approx([1.0, 0.5, 0.0])


def test_adamw_hyperparameters_and_schedule_errors():
    optim = _optim("lr=3e-4", "weight_decay=0.1", "betas=[0.8,0.9]")
    opt = build_optimizer([torch.nn.Parameter(torch.zeros(1))], optim)
    assert opt.defaults["lr"] == 3e-4 and opt.defaults["betas"] == (0.8, 0.9) and opt.defaults["weight_decay"] == 0.1
    with pytest.raises(ValueError, match="lr_scheduler='linear'"):
        lr_schedule(opt, "linear", 0, 10, 0.0, 0.5)


def test_verl_lr_scheduler_type_and_one_indexed_steps():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", ConfigWarning)  # verl's current spelling: copied without a warning
        optim = _optim("lr_scheduler_type=cosine", "lr_warmup_steps=0")
    assert optim.lr_scheduler == "cosine"
    # zero_indexed_step=false: the cosine schedule's first update is step 1 of the warmup (1/2 of lr, not 0)
    opt, sched = _sched(_optim("lr_warmup_steps=2", "lr_scheduler=cosine", "zero_indexed_step=false"), 10)
    assert _lrs(sched, opt, 2) == pytest.approx([0.5, 1.0])
    opt, sched = _sched(_optim("lr_warmup_steps=2", "zero_indexed_step=false"), 10)  # constant: unshifted
    assert _lrs(sched, opt, 3) == [0.0, 0.5, 1.0]
    with pytest.raises(Exception, match="lr_scheduler_type='linear' and .*lr_scheduler='cosine' are two spellings"):
        _optim("lr_scheduler_type=linear", "lr_scheduler=cosine")
