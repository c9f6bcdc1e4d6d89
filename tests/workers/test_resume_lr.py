"""A resumed run trains at its configured learning rate: the checkpoint's optimizer and schedule state come back
(moments, step count, the schedule's position) but a changed LR replaces the saved one, with a note saying so."""

from __future__ import annotations

import pytest
import torch

from rlpost.utils.optim import lr_schedule
from rlpost.checkpoint.fsdp import _configured_lrs, _keep_configured_lrs

pytestmark = pytest.mark.timeout(60)


def _run(lr: float, steps: int):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    sched = lr_schedule(opt, "cosine", 2, 10, 0.0, 0.5)  # warm-up 2 of 10 steps, cosine to 0
    for _ in range(steps):
        model(torch.ones(1, 4)).sum().backward()
        opt.step()
        sched.step()
    return model, opt, sched


def test_a_changed_lr_applies_after_resume_at_the_schedules_position():
    _, old_opt, old_sched = _run(1e-4, 4)
    _, opt, sched = _run(1e-3, 0)  # the resumed run, configured at 1e-3
    configured = _configured_lrs(opt)
    opt.load_state_dict(old_opt.state_dict())
    sched.load_state_dict(old_sched.state_dict())
    assert opt.param_groups[0]["lr"] == pytest.approx(old_opt.param_groups[0]["lr"])  # what a plain load gives
    notes = _keep_configured_lrs(opt, sched, configured)
    assert notes == ["learning rate 0.001 (the checkpoint's was 0.0001)"]
    factor = sched.lr_lambdas[0](4)  # the cosine factor at step 4, as the saved run had it
    assert opt.param_groups[0]["lr"] == pytest.approx(1e-3 * factor)
    assert old_opt.param_groups[0]["lr"] == pytest.approx(1e-4 * factor)
    sched.step()  # and the schedule goes on from the new base
    assert opt.param_groups[0]["lr"] == pytest.approx(1e-3 * sched.lr_lambdas[0](5))
    assert opt.state_dict()["state"][0]["step"] == 4  # Adam's moments and step count are the checkpoint's


def test_the_same_lr_leaves_the_restored_state_alone():
    _, old_opt, old_sched = _run(1e-4, 3)
    _, opt, sched = _run(1e-4, 0)
    configured = _configured_lrs(opt)
    opt.load_state_dict(old_opt.state_dict())
    sched.load_state_dict(old_sched.state_dict())
    assert _keep_configured_lrs(opt, sched, configured) == []
    assert opt.param_groups[0]["lr"] == pytest.approx(old_opt.param_groups[0]["lr"])
