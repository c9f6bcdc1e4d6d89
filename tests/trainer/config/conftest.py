"""Fixtures for the config tests: the default config composed once, cheap copies with overrides."""

import copy
from typing import Any

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf

from rlpost.trainer.config import CONFIG_DIR


def compose_config(name: str = "ppo_trainer", overrides: tuple[str, ...] = ()) -> DictConfig:
    """Compose a packaged config through Hydra, with command-line style overrides."""
    with initialize_config_dir(str(CONFIG_DIR), version_base=None):
        return compose(name, overrides=list(overrides))


@pytest.fixture(scope="session")
def compose_fn():
    """`compose_config(name="ppo_trainer", overrides=())` for tests that need real Hydra composition."""
    return compose_config


@pytest.fixture(scope="session")
def default_cfg() -> DictConfig:
    """The default `ppo_trainer` config (composed once per session; copy before changing it)."""
    return compose_config()


@pytest.fixture
def make_cfg(default_cfg):
    """Copy of the default with `{dotted.key: value}` applied like Hydra overrides (new keys like `+key`)."""

    def _make(values: dict[str, Any] | None = None) -> DictConfig:
        cfg = copy.deepcopy(default_cfg)
        for key, value in (values or {}).items():
            OmegaConf.update(cfg, key, value, merge=False, force_add=True)  # like `+key=value`
        return cfg

    return _make


@pytest.fixture
def small_cfg(make_cfg):
    """`make_cfg` starting from SMALL: `small_cfg({key: value})`."""
    return lambda values=None: make_cfg({**SMALL, **(values or {})})


# A small valid setup (2 CPU processes, GRPO) that the rule tests start from.
SMALL = {
    "trainer.device": "cpu",
    "trainer.n_gpus_per_node": 2,
    "data.train_batch_size": 8,
    "actor_rollout_ref.rollout.n": 4,
    "actor_rollout_ref.rollout.tensor_model_parallel_size": 1,
    "actor_rollout_ref.actor.ppo_mini_batch_size": 4,
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 2,
    "algorithm.adv_estimator": "grpo",
    "actor_rollout_ref.actor.use_kl_loss": True,
}


@pytest.fixture
def config_error(small_cfg):
    """`config_error({key: value})`: the one-line ConfigError message `validate_config` raises on SMALL plus
    the values."""
    from rlpost.trainer.config import ConfigError, validate_config

    def _message(values: dict) -> str:
        with pytest.raises(ConfigError) as err:
            validate_config(small_cfg(values))
        assert "\n" not in str(err.value)
        return str(err.value)

    return _message
