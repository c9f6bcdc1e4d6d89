"""Typed schema of the SFT trainer's config (`rlpost/trainer/config/sft_trainer.yaml`): one dataclass per group.

Types and value constraints only; the defaults live in the YAML (one source).
`rlpost.config.convert.to_typed_root(cfg, SFTTrainerConfig)` builds it and names any missing, unknown or
mistyped key; `rlpost.config.constraints.check_fields` applies the constraints.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from rlpost.config.base import BaseConfig
from rlpost.config.constraints import (
    BETAS,
    CLOSED_UNIT,
    NON_NEGATIVE,
    POSITIVE,
    POSITIVE_FLOAT,
    POSITIVE_OR_NULL,
    STEPS_OR_NEVER,
    Constraint,
)
from rlpost.config.schema import CustomClsConfig

SEQUENCE_LENGTH = Constraint("must be an integer > 1 (prompt and response tokens)", lambda v: v > 1,
                             lambda v: "1024")


@dataclass(frozen=True)
class SFTMultiturnConfig(BaseConfig):
    """`data.multiturn`."""

    enable: bool


@dataclass(frozen=True)
class SFTDataConfig(BaseConfig):
    """`data`: the prompt/response parquet files and how a row becomes a training sequence."""

    train_files: str | list[str]
    val_files: str | list[str] | None
    prompt_key: str
    response_key: str
    prompt_dict_keys: list[str] | None
    response_dict_keys: list[str] | None
    tools_key: str | None
    image_key: str | None
    max_length: Annotated[int, SEQUENCE_LENGTH]
    truncation: str
    train_batch_size: Annotated[int, POSITIVE]
    micro_batch_size_per_gpu: Annotated[int, POSITIVE]
    chat_template: str | None
    balance_dp_token: bool
    use_shm: bool
    multiturn: SFTMultiturnConfig
    custom_cls: CustomClsConfig


@dataclass(frozen=True)
class SFTFsdpConfig(BaseConfig):
    """`model.fsdp_config`."""

    cpu_offload: bool
    offload_params: bool


@dataclass(frozen=True)
class SFTModelConfig(BaseConfig):
    """`model`: the Hugging Face model to fine-tune."""

    partial_pretrain: str
    trust_remote_code: bool
    enable_gradient_checkpointing: bool
    external_lib: str | None
    use_shm: bool
    lora_rank: Annotated[int, NON_NEGATIVE]
    use_liger: bool
    fsdp_config: SFTFsdpConfig


@dataclass(frozen=True)
class SFTOptimConfig(BaseConfig):
    """`optim`: AdamW and the learning-rate schedule."""

    lr: Annotated[float, NON_NEGATIVE]
    betas: Annotated[list[float], BETAS]
    weight_decay: Annotated[float, NON_NEGATIVE]
    warmup_steps_ratio: Annotated[float, CLOSED_UNIT]
    clip_grad: Annotated[float, POSITIVE_FLOAT]
    lr_scheduler: str
    min_lr_ratio: Annotated[float, CLOSED_UNIT]


@dataclass(frozen=True)
class SFTRunConfig(BaseConfig):
    """`trainer`: the loop, logging and checkpoints."""

    default_local_dir: str
    default_hdfs_dir: str | None
    resume_path: str | None
    project_name: str
    experiment_name: str
    total_epochs: Annotated[int, POSITIVE]
    total_training_steps: Annotated[int | None, POSITIVE_OR_NULL]
    logger: list[str]
    seed: int
    save_freq: Annotated[int, STEPS_OR_NEVER]
    test_freq: Annotated[int, STEPS_OR_NEVER]
    max_ckpt_to_keep: Annotated[int | None, POSITIVE_OR_NULL]
    device: str | None
    nnodes: Annotated[int, POSITIVE]
    n_gpus_per_node: Annotated[int, POSITIVE]


@dataclass(frozen=True)
class SFTTrainerConfig(BaseConfig):
    """The whole SFT trainer config."""

    data: SFTDataConfig
    model: SFTModelConfig
    optim: SFTOptimConfig
    ulysses_sequence_parallel_size: Annotated[int, POSITIVE]
    use_remove_padding: bool
    trainer: SFTRunConfig
