"""The SFT trainer's typed config: converted once from its YAML, unknown keys and bad values named."""

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from rlpost.config.errors import ConfigError
from rlpost.config.schema_sft import SFTTrainerConfig
from rlpost.trainer.fsdp_sft_trainer import sft_config

pytestmark = pytest.mark.timeout(60)

YAML = Path(__file__).resolve().parents[2] / "rlpost/trainer/config/sft_trainer.yaml"


def _cfg(**over):
    return OmegaConf.merge(OmegaConf.load(YAML), OmegaConf.from_dotlist([f"{k}={v}" for k, v in over.items()]))


def test_yaml_defaults_convert_to_typed_values():
    typed = sft_config(_cfg())
    assert isinstance(typed, SFTTrainerConfig)
    assert typed.optim.lr == 1e-5 and isinstance(typed.optim.lr, float)  # YAML 1.1 reads `1e-5` as a string
    assert typed.data.max_length == 1024 and typed.trainer.logger == ["console"]
    assert typed.trainer.default_local_dir == "checkpoints/gsm8k-sft/test"  # interpolation resolved
    assert sft_config(typed) is typed  # already typed: handed through


def test_unknown_key_is_matched_against_the_sft_keys():
    cfg = _cfg()
    OmegaConf.set_struct(cfg, False)
    cfg.data.micro_batch_size = 2  # verl's old name of micro_batch_size_per_gpu
    with pytest.raises(ConfigError, match=r"unknown key 'data.micro_batch_size'.*data.micro_batch_size_per_gpu"):
        sft_config(cfg)


@pytest.mark.parametrize("key, value, fix", [
    ("data.max_length", 1, "data.max_length=1024"),
    ("data.micro_batch_size_per_gpu", 0, "data.micro_batch_size_per_gpu=1"),
    ("optim.warmup_steps_ratio", 1.5, "optim.warmup_steps_ratio=1.0"),
    ("trainer.save_freq", 0, "trainer.save_freq=-1"),
])
def test_values_outside_their_range_name_the_key_and_a_value_that_works(key, value, fix):
    with pytest.raises(ValueError, match=rf"{key}={value}: .*use {fix}\."):
        sft_config(_cfg(**{key: value}))


def test_mistyped_value_is_named():
    with pytest.raises(ConfigError, match=r"data.train_batch_size='many': expected int"):
        sft_config(_cfg(**{"data.train_batch_size": "many"}))
