"""`optim.optimizer` / `optim.optimizer_impl` / `optim.override_optimizer_config`: the class named is the one
built, with verl's arguments (lr, weight_decay, betas only for an Adam), one step of each checked by hand; a
module of the user's own; and each bad value stopped with one message naming its key."""

import subprocess
import sys

import pytest
import torch

from _compose import SMALL, compose_config
from rlpost.trainer.main_ppo import run
from rlpost.utils.optim import build_optimizer, optimizer_kwargs

KEY = "actor_rollout_ref.actor.optim"


def _optim(*overrides: str):
    """The composed actor optim group with lr 0.1, weight decay 0 and the given `optim.*` overrides."""
    keys = [f"{KEY}.{o}" for o in ("lr=0.1", "weight_decay=0.0", *overrides)]
    return compose_config(*SMALL, "actor_rollout_ref.rollout.name=hf", *keys).actor_rollout_ref.actor.optim


def _one_step(opt_cfg, start=1.0, grad=2.0):
    p = torch.nn.Parameter(torch.tensor([start]))
    opt = build_optimizer([p], opt_cfg, KEY)
    p.grad = torch.tensor([grad])
    opt.step()
    return opt, float(p.detach())


@pytest.mark.timeout(60)
def test_default_is_torch_adamw_with_the_configured_betas():
    opt, _ = _one_step(_optim("betas=[0.8,0.95]"))
    assert type(opt) is torch.optim.AdamW
    assert opt.param_groups[0]["betas"] == (0.8, 0.95) and opt.param_groups[0]["weight_decay"] == 0.0


@pytest.mark.timeout(60)
def test_sgd_with_nesterov_momentum_takes_the_hand_derived_step():
    opt, value = _one_step(_optim("optimizer=SGD", "override_optimizer_config="
                                  "{momentum:0.9,nesterov:true}"))
    assert type(opt) is torch.optim.SGD and "betas" not in opt.param_groups[0]  # no betas for a non-Adam
    # first step: buf = g = 2; nesterov uses g + 0.9 * buf = 3.8; p = 1 - 0.1 * 3.8
    assert value == pytest.approx(0.62, abs=1e-6)
    assert torch.equal(opt.state[opt.param_groups[0]["params"][0]]["momentum_buffer"], torch.tensor([2.0]))


@pytest.mark.timeout(60)
def test_adam_with_amsgrad_keeps_its_extra_state():
    opt, value = _one_step(_optim("optimizer=Adam", "override_optimizer_config="
                                  "{amsgrad:true}"))
    state = opt.state[opt.param_groups[0]["params"][0]]
    assert type(opt) is torch.optim.Adam and "max_exp_avg_sq" in state
    assert value == pytest.approx(0.9, abs=1e-6)  # Adam's first step moves by lr (bias-corrected m / sqrt(v) = 1)


@pytest.mark.timeout(60)
def test_an_optimizer_module_of_the_users_own(tmp_path, monkeypatch):
    (tmp_path / "my_optims.py").write_text(
        "import torch\n\n"
        "class SignDescent(torch.optim.Optimizer):\n"
        "    def __init__(self, params, lr=0.01, weight_decay=0.0, scale=1.0):\n"
        "        super().__init__(params, dict(lr=lr, weight_decay=weight_decay, scale=scale))\n\n"
        "    @torch.no_grad()\n"
        "    def step(self, closure=None):\n"
        "        for group in self.param_groups:\n"
        "            for p in group['params']:\n"
        "                p.add_(torch.sign(p.grad), alpha=-group['lr'] * group['scale'])\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    opt, value = _one_step(_optim("optimizer=SignDescent", "optimizer_impl=my_optims",
                                  "override_optimizer_config={scale:3.0}"), grad=-5.0)
    assert type(opt).__name__ == "SignDescent" and value == pytest.approx(1.3)  # 1 - 0.1 * 3 * sign(-5)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("overrides, expected", [
    (("optimizer_impl=no_such_optim_pkg",), f"{KEY}.optimizer_impl=no_such_optim_pkg: the module does not import"),
    (("optimizer=AdamWW",), f"{KEY}.optimizer=AdamWW: torch.optim has no such class; its optimisers: "),
    (("optimizer=sqrt", "optimizer_impl=math"), f"{KEY}.optimizer=sqrt: math.sqrt is not a torch.optim.Optimizer"),
    (("optimizer=SGD", "override_optimizer_config={momentun:0.9}"),
     f"{KEY}.override_optimizer_config.momentun: torch.optim.sgd.SGD takes no argument 'momentun'; it takes lr, "
     "momentum"),
])
def test_bad_values_name_their_key(overrides, expected):
    with pytest.raises(ValueError) as err:
        optimizer_kwargs(_optim(*overrides), KEY)
    assert str(err.value).startswith(expected), str(err.value)
    if "no such class" in expected:
        assert "AdamW" in str(err.value)


@pytest.mark.timeout(120)
def test_main_ppo_stops_a_bad_critic_optimizer_before_ray(tiny_model_dir, tmp_path, capsys):
    from hydra import compose, initialize_config_dir

    import rlpost.trainer.config as config_pkg

    subprocess.run([sys.executable, "examples/data_preprocess/arith.py", "--local_dir", str(tmp_path),
                    "--train_size", "8", "--test_size", "4"], check=True, capture_output=True)
    overrides = ["trainer.device=cpu", "trainer.n_gpus_per_node=2",
                 "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
                 f"actor_rollout_ref.model.path={tiny_model_dir}", f"critic.model.path={tiny_model_dir}",
                 f"data.train_files={tmp_path / 'train.parquet'}", f"data.val_files={tmp_path / 'test.parquet'}",
                 "algorithm.adv_estimator=gae", "critic.optim.optimizer=Adagrad",
                 "critic.optim.override_optimizer_config={betas:[0.9,0.99]}"]
    with initialize_config_dir(config_dir=config_pkg.__path__[0], version_base=None):
        status = run(compose("ppo_trainer", overrides=overrides))
    err = capsys.readouterr().err
    assert status == 2
    assert "critic.optim.override_optimizer_config.betas: torch.optim.adagrad.Adagrad takes no argument" in err, err
    import ray

    assert not ray.is_initialized()
