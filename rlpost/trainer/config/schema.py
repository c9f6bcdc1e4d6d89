"""Typed schema of the composed `ppo_trainer` config: one dataclass per group.

Types only, no defaults: the defaults live in the YAML files beside this module (one source).
`rlpost.trainer.config.convert.to_typed(cfg)` builds a `PPOTrainerConfig` and names the key of
any missing, unknown or mistyped value.
"""

from dataclasses import dataclass
from typing import Any

from rlpost.trainer.config.schema_workers import (
    ActorRolloutRefConfig,
    CheckpointConfig,
    FsdpConfig,
    OptimConfig,
    WrapPolicyConfig,
)


@dataclass
class CustomClsConfig:
    """`data.custom_cls`."""

    path: str | None
    name: str | None


@dataclass
class DataConfig:
    """`data`."""

    tokenizer: str | None
    use_shm: bool
    train_files: str | list[str]
    val_files: str | list[str] | None
    prompt_key: str
    reward_fn_key: str
    max_prompt_length: int
    max_response_length: int
    train_batch_size: int
    val_batch_size: int | None
    return_raw_input_ids: bool
    return_raw_chat: bool
    return_full_prompt: bool
    train_shuffle: bool
    shuffle: bool
    val_shuffle: bool
    validation_shuffle: bool
    seed: int
    dataloader_num_workers: int
    filter_overlong_prompts: bool
    filter_overlong_prompts_workers: int
    truncation: str
    image_key: str | None
    video_key: str | None
    trust_remote_code: bool
    custom_cls: CustomClsConfig


@dataclass
class CriticModelConfig:
    """`critic.model`."""

    path: str
    tokenizer_path: str
    override_config: dict[str, Any]
    external_lib: str | list[str] | None
    trust_remote_code: bool
    enable_gradient_checkpointing: bool
    use_remove_padding: bool
    fsdp_config: FsdpConfig


@dataclass
class CriticConfig:
    """`critic`."""

    enable: bool | None
    strategy: str
    rollout_n: int
    model: CriticModelConfig
    optim: OptimConfig
    ppo_mini_batch_size: int
    ppo_micro_batch_size: int | None
    ppo_micro_batch_size_per_gpu: int | None
    forward_micro_batch_size_per_gpu: int | None
    use_dynamic_bsz: bool
    ppo_max_token_len_per_gpu: int
    forward_max_token_len_per_gpu: int
    ppo_epochs: int
    shuffle: bool
    grad_clip: float
    cliprange_value: float
    loss_agg_mode: str
    ulysses_sequence_parallel_size: int
    checkpoint: CheckpointConfig


@dataclass
class RewardFsdpConfig:
    """`reward_model.model.fsdp_config` (keeps the deprecated flat `min_num_params`)."""

    wrap_policy: WrapPolicyConfig
    min_num_params: int
    param_offload: bool
    reshard_after_forward: bool
    fsdp_size: int
    forward_prefetch: bool


@dataclass
class RewardModelModelConfig:
    """`reward_model.model`."""

    input_tokenizer: str | None
    path: str
    external_lib: str | list[str] | None
    use_shm: bool
    use_remove_padding: bool
    use_fused_kernels: bool
    trust_remote_code: bool
    fsdp_config: RewardFsdpConfig


@dataclass
class SandboxFusionConfig:
    """`reward_model.sandbox_fusion`."""

    url: str | None
    max_concurrent: int


@dataclass
class RewardProfilerConfig:
    """`reward_model.profiler`."""

    discrete: bool


@dataclass
class OverlongBufferConfig:
    """`reward_model.overlong_buffer` (read by the dapo reward manager)."""

    enable: bool
    len: int
    penalty_factor: float
    log: bool


@dataclass
class RewardModelConfig:
    """`reward_model`."""

    enable: bool
    strategy: str
    model: RewardModelModelConfig
    micro_batch_size_per_gpu: int | None
    max_length: int | None
    use_dynamic_bsz: bool
    forward_max_token_len_per_gpu: int
    reward_manager: str
    reward_kwargs: dict[str, Any]
    overlong_buffer: OverlongBufferConfig
    launch_reward_fn_async: bool
    sandbox_fusion: SandboxFusionConfig
    profiler: RewardProfilerConfig


@dataclass
class CustomRewardFunctionConfig:
    """`custom_reward_function`."""

    path: str | None
    name: str
    reward_kwargs: dict[str, Any]


@dataclass
class KlCtrlConfig:
    """`algorithm.kl_ctrl`."""

    type: str
    kl_coef: float
    horizon: int
    target_kl: float


@dataclass
class PfPpoConfig:
    """`algorithm.pf_ppo`."""

    reweight_method: str
    weight_pow: float


@dataclass
class AlgorithmConfig:
    """`algorithm`."""

    gamma: float
    lam: float
    adv_estimator: str
    norm_adv_by_std_in_grpo: bool
    use_kl_in_reward: bool
    kl_penalty: str
    kl_ctrl: KlCtrlConfig
    use_pf_ppo: bool
    pf_ppo: PfPpoConfig


@dataclass
class TrainerConfig:
    """`trainer`."""

    balance_batch: bool
    total_epochs: int
    total_training_steps: int | None
    profile_steps: list[int] | None
    project_name: str
    experiment_name: str
    logger: list[str]
    log_val_generations: int
    rollout_data_dir: str | None
    validation_data_dir: str | None
    nnodes: int
    n_gpus_per_node: int
    save_freq: int
    resume_mode: str
    resume_from_path: str | None
    val_before_train: bool
    val_only: bool
    test_freq: int
    critic_warmup: int
    default_hdfs_dir: str | None
    del_local_ckpt_after_load: bool
    default_local_dir: str
    remove_previous_ckpt_in_save: bool
    max_actor_ckpt_to_keep: int | None
    max_critic_ckpt_to_keep: int | None
    ray_wait_register_center_timeout: int
    ray_call_timeout: float
    device: str
    dry_run: bool
    rollout_drift_warn: float
    controller_nsight_options: dict[str, Any]
    worker_nsight_options: dict[str, Any]


@dataclass
class RayInitConfig:
    """`ray_init`."""

    num_cpus: int | None
    timeline_json_file: str | None


@dataclass
class PPOTrainerConfig:
    """The whole composed `ppo_trainer` config."""

    data: DataConfig
    actor_rollout_ref: ActorRolloutRefConfig
    critic: CriticConfig
    reward_model: RewardModelConfig
    custom_reward_function: CustomRewardFunctionConfig
    algorithm: AlgorithmConfig
    trainer: TrainerConfig
    ray_init: RayInitConfig
