"""AdamW + LR schedules: warmup rule, constant and cosine values by hand."""

import math

import pytest
import torch
from omegaconf import OmegaConf

from rlpost.utils.optim import build_lr_scheduler, build_optimizer, cosine_lr_lambda, num_warmup_steps


def _sched(**optim):
    p = torch.nn.Parameter(torch.zeros(2))
    opt = build_optimizer([p], OmegaConf.create({"lr": 1.0, **optim}))
    return opt, build_lr_scheduler(opt, OmegaConf.create({"lr": 1.0, **optim}))


def _lrs(sched, opt, n):
    out = []
    for _ in range(n):
        out.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
    return out


def test_warmup_steps_negative_uses_ratio():
    assert num_warmup_steps({"lr_warmup_steps": -1, "lr_warmup_steps_ratio": 0.25}, 20) == 5
    assert num_warmup_steps({"lr_warmup_steps": 3, "lr_warmup_steps_ratio": 0.25}, 20) == 3


def test_constant_with_warmup():
    opt, sched = _sched(lr_warmup_steps=2, warmup_style="constant", total_training_steps=10)
    assert _lrs(sched, opt, 4) == [0.0, 0.5, 1.0, 1.0]


def test_cosine_reaches_min_ratio():
    opt, sched = _sched(lr_warmup_steps=0, lr_scheduler="cosine", min_lr_ratio=0.1, total_training_steps=4)
    lrs = _lrs(sched, opt, 5)
    assert lrs[0] == pytest.approx(1.0)
    assert lrs[2] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert lrs[4] == pytest.approx(0.1)
    assert cosine_lr_lambda(1, 2, 10, 0.0, 0.5) == pytest.approx(0.5)


def test_adamw_hyperparameters_and_errors():
    p = torch.nn.Parameter(torch.zeros(1))
    opt = build_optimizer([p], {"lr": 3e-4, "weight_decay": 0.1, "betas": [0.8, 0.9]})
    assert opt.defaults["lr"] == 3e-4 and opt.defaults["betas"] == (0.8, 0.9) and opt.defaults["weight_decay"] == 0.1
    with pytest.raises(ValueError, match="warmup_style"):
        build_lr_scheduler(opt, {"warmup_style": "linear"})
    with pytest.raises(ValueError, match="total_training_steps"):
        build_lr_scheduler(opt, {"warmup_style": "cosine"})
