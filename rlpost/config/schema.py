"""Typed schema of the composed `ppo_trainer` config: one dataclass per group.

Types only, no defaults: the defaults live in the YAML files beside this module (one source).
`rlpost.trainer.config.convert.to_typed(cfg)` builds a `PPOTrainerConfig` and names the key of
any missing, unknown or mistyped value.
"""

from dataclasses import dataclass
from typing import Annotated, Any

from rlpost.config.base import BaseConfig
from rlpost.config.constraints import (
    CLOSED_UNIT,
    NON_NEGATIVE,
    POSITIVE,
    POSITIVE_FLOAT,
    POSITIVE_OR_NULL,
    STEPS_OR_NEVER,
)
from rlpost.config.schema_async import TrainerV1Config
from rlpost.config.schema_distillation import DistillationConfig
from rlpost.config.schema_judge import JudgeConfig

from rlpost.config.schema_workers import (
    ActorRolloutRefConfig,
    CheckpointConfig,
    FsdpConfig,
    FusedKernelOptionsConfig,
    OffloadConfig,
    OptimConfig,
    ProfilerConfig,
    QatConfig,
    WrapPolicyConfig,
)


@dataclass(frozen=True)
class CustomClsConfig(BaseConfig):
    """`data.custom_cls`."""

    path: str | None
    name: str | None


@dataclass(frozen=True)
class SamplerConfig(BaseConfig):
    """`data.sampler`: a user sampler class."""

    class_path: str | None
    class_name: str | None


@dataclass(frozen=True)
class DataConfig(BaseConfig):
    """`data`."""

    tokenizer: str | None
    use_shm: bool
    train_files: str | list[str]
    val_files: str | list[str] | None
    prompt_key: str
    reward_fn_key: str
    max_prompt_length: Annotated[int, POSITIVE]
    max_response_length: Annotated[int, POSITIVE]
    train_batch_size: Annotated[int, POSITIVE]
    val_batch_size: Annotated[int | None, POSITIVE_OR_NULL]
    return_raw_input_ids: bool
    return_raw_chat: bool
    tool_config_path: str | None
    return_full_prompt: bool
    train_shuffle: bool
    shuffle: bool
    val_shuffle: bool
    validation_shuffle: bool
    seed: int
    dataloader_num_workers: Annotated[int, NON_NEGATIVE]
    filter_overlong_prompts: bool
    filter_overlong_prompts_workers: Annotated[int, POSITIVE]
    truncation: str
    image_key: str | None
    video_key: str | None
    audio_key: str | None
    image_patch_size: int
    mm_processor_kwargs: dict[str, Any]
    trust_remote_code: bool
    custom_cls: CustomClsConfig
    gen_batch_size: Annotated[int, POSITIVE]
    train_max_samples: int
    val_max_samples: int
    return_multi_modal_inputs: bool
    sampler: SamplerConfig
    datagen: CustomClsConfig
    apply_chat_template_kwargs: dict[str, Any]


@dataclass(frozen=True)
class CriticModelConfig(BaseConfig):
    """`critic.model`."""

    path: str
    tokenizer_path: str
    override_config: dict[str, Any]
    external_lib: str | list[str] | None
    trust_remote_code: bool
    enable_gradient_checkpointing: bool
    use_remove_padding: bool
    use_shm: bool
    enable_activation_offload: bool
    lora_rank: int
    lora_alpha: int
    target_modules: str | list[str]
    exclude_modules: str | list[str] | None
    lora_adapter_path: str | None
    hf_config_path: str | None
    custom_chat_template: str | None
    use_liger: bool
    use_fused_kernels: bool
    fused_kernel_options: FusedKernelOptionsConfig
    tiled_mlp: dict[str, Any]  # not built (unsupported.UNBUILT_GROUPS)
    mtp: dict[str, Any]  # not built (unsupported.UNBUILT_GROUPS)
    fsdp_config: FsdpConfig


@dataclass(frozen=True)
class CriticFsdpRefConfig(BaseConfig):
    """`critic.fsdp`: verl's newer engine-level spelling of `critic.model.fsdp_config` settings."""

    wrap_policy: WrapPolicyConfig
    reshard_after_forward: bool
    fsdp_size: int
    forward_prefetch: bool
    model_dtype: str
    dtype: str | None
    offload: OffloadConfig
    param_offload: bool
    optimizer_offload: bool
    offload_policy: bool
    use_orig_params: bool
    strategy: str
    ulysses_sequence_parallel_size: int
    entropy_from_logits_with_chunking: bool
    entropy_from_logits_chunk_size: int
    use_torch_compile: bool
    entropy_checkpointing: bool
    forward_only: bool
    use_no_sync_for_gradient_accumulation: bool
    pad_to_length: bool
    pad_to_length_bucket: int
    full_determinism: bool
    seed: int
    qat: QatConfig
    turbo_config: dict[str, Any]  # not built (unsupported.UNBUILT_GROUPS)


@dataclass(frozen=True)
class CriticConfig(BaseConfig):
    """`critic`."""

    enable: bool | None
    strategy: str
    rollout_n: int
    model: CriticModelConfig
    optim: OptimConfig
    ppo_mini_batch_size: Annotated[int, POSITIVE]
    ppo_micro_batch_size: int | None
    ppo_micro_batch_size_per_gpu: int | None
    forward_micro_batch_size_per_gpu: int | None
    use_dynamic_bsz: bool
    ppo_max_token_len_per_gpu: Annotated[int, POSITIVE]
    forward_max_token_len_per_gpu: Annotated[int, POSITIVE]
    ppo_epochs: Annotated[int, POSITIVE]
    shuffle: bool
    data_loader_seed: int | None
    grad_clip: Annotated[float, POSITIVE_FLOAT]
    cliprange_value: Annotated[float, POSITIVE_FLOAT]
    loss_agg_mode: str
    ulysses_sequence_parallel_size: int
    checkpoint: CheckpointConfig
    profiler: ProfilerConfig
    forward_micro_batch_size: int | None
    fsdp: CriticFsdpRefConfig


@dataclass(frozen=True)
class RewardFsdpConfig(BaseConfig):
    """`reward_model.model.fsdp_config` (keeps the deprecated flat `min_num_params`)."""

    wrap_policy: WrapPolicyConfig
    min_num_params: int
    param_offload: bool
    reshard_after_forward: bool
    fsdp_size: int
    forward_prefetch: bool


@dataclass(frozen=True)
class RewardModelModelConfig(BaseConfig):
    """`reward_model.model`."""

    input_tokenizer: str | None
    path: str
    external_lib: str | list[str] | None
    use_shm: bool
    use_remove_padding: bool
    use_fused_kernels: bool
    trust_remote_code: bool
    override_config: dict[str, Any]
    fsdp_config: RewardFsdpConfig


@dataclass(frozen=True)
class SandboxFusionConfig(BaseConfig):
    """`reward_model.sandbox_fusion`."""

    url: str | None
    max_concurrent: Annotated[int, POSITIVE]
    memory_limit_mb: int


@dataclass(frozen=True)
class RewardRolloutConfig(BaseConfig):
    """`reward_model.rollout`: the engine of a generative reward model."""

    name: str | None
    prompt_length: int
    response_length: int
    tensor_model_parallel_size: int
    gpu_memory_utilization: float
    max_model_len: int | None
    engine_kwargs: dict[str, Any]
    dtype: str
    enforce_eager: bool
    cudagraph_capture_sizes: list[int] | None
    free_cache_engine: bool
    data_parallel_size: int
    expert_parallel_size: int
    max_num_batched_tokens: int
    max_num_seqs: int
    load_format: str
    limit_images: Any  # null, or the engine's per-modality limits
    enable_chunked_prefill: bool
    enable_prefix_caching: bool
    disable_log_stats: bool
    skip_tokenizer_init: bool


@dataclass(frozen=True)
class OverlongBufferConfig(BaseConfig):
    """`reward_model.overlong_buffer` (read by the dapo reward manager)."""

    enable: bool
    len: Annotated[int, NON_NEGATIVE]
    penalty_factor: Annotated[float, NON_NEGATIVE]
    log: bool


@dataclass(frozen=True)
class RewardEngineConfig(RewardRolloutConfig):
    """`reward_model.inference`: verl's reward-loop engine settings (not used by rlpost's FSDP reward model). The
    keys rlpost has under `reward_model.rollout` follow those, and a value set here is copied onto them."""


@dataclass(frozen=True)
class RewardModelConfig(BaseConfig):
    """`reward_model`."""

    enable: bool
    enable_resource_pool: bool
    n_gpus_per_node: int
    nnodes: int
    use_reward_loop: bool
    num_workers: int
    ulysses_sequence_parallel_size: int
    strategy: str
    model: RewardModelModelConfig
    micro_batch_size_per_gpu: int | None
    micro_batch_size: int | None
    max_length: Annotated[int | None, POSITIVE_OR_NULL]
    use_dynamic_bsz: bool
    forward_max_token_len_per_gpu: Annotated[int, POSITIVE]
    reward_manager: str
    reward_loop_source: str
    reward_loop_module_path: str | None
    reward_loop_class_name: str | None
    reward_kwargs: dict[str, Any]
    overlong_buffer: OverlongBufferConfig
    launch_reward_fn_async: bool
    sandbox_fusion: SandboxFusionConfig
    profiler: ProfilerConfig
    rollout: RewardRolloutConfig
    model_path: str | None
    inference: RewardEngineConfig
    judge: JudgeConfig


@dataclass(frozen=True)
class CustomRewardFunctionConfig(BaseConfig):
    """`custom_reward_function`."""

    path: str | None
    name: str
    reward_kwargs: dict[str, Any]


@dataclass(frozen=True)
class KlCtrlConfig(BaseConfig):
    """`algorithm.kl_ctrl`."""

    type: str
    kl_coef: Annotated[float, NON_NEGATIVE]
    horizon: Annotated[int, POSITIVE]
    target_kl: Annotated[float, POSITIVE_FLOAT]


@dataclass(frozen=True)
class PfPpoConfig(BaseConfig):
    """`algorithm.pf_ppo`."""

    reweight_method: str
    weight_pow: float


@dataclass(frozen=True)
class RolloutCorrectionConfig(BaseConfig):
    """`algorithm.rollout_correction`: importance weights / rejection from the rollout's log-probs."""

    rollout_is: str | None
    rollout_is_threshold: float | str
    rollout_is_batch_normalize: bool
    rollout_rs: str | None
    rollout_rs_threshold: float | str | None
    rollout_rs_threshold_lower: float | None
    rollout_token_veto_threshold: float | None
    bypass_mode: bool
    loss_type: str


@dataclass(frozen=True)
class FilterGroupsConfig(BaseConfig):
    """`algorithm.filter_groups`: DAPO dynamic sampling."""

    enable: bool
    metric: str
    max_num_gen_batches: int


@dataclass(frozen=True)
class AlgorithmConfig(BaseConfig):
    """`algorithm`."""

    gamma: Annotated[float, CLOSED_UNIT]
    lam: Annotated[float, CLOSED_UNIT]
    adv_estimator: str
    norm_adv_by_std_in_grpo: bool
    gdpo_reward_keys: list[str] | None
    gdpo_reward_weights: list[float] | None
    codapo_top_k: int | None
    codapo_weight_offset: float | None
    codapo_accuracy_key: str | None
    use_kl_in_reward: bool
    kl_penalty: str
    kl_ctrl: KlCtrlConfig
    use_pf_ppo: bool
    pf_ppo: PfPpoConfig
    rollout_correction: RolloutCorrectionConfig
    filter_groups: FilterGroupsConfig


@dataclass(frozen=True)
class TrainerConfig(BaseConfig):
    """`trainer`."""

    balance_batch: bool
    total_epochs: Annotated[int, POSITIVE]
    total_training_steps: Annotated[int | None, POSITIVE_OR_NULL]
    profile_steps: list[int] | None
    project_name: str
    experiment_name: str
    logger: list[str]
    log_val_generations: Annotated[int, NON_NEGATIVE]
    rollout_data_dir: str | None
    validation_data_dir: str | None
    nnodes: Annotated[int, POSITIVE]
    n_gpus_per_node: Annotated[int, POSITIVE]
    save_freq: Annotated[int, STEPS_OR_NEVER]
    resume_mode: str
    resume_from_path: str | None
    val_before_train: bool
    val_only: bool
    test_freq: Annotated[int, STEPS_OR_NEVER]
    critic_warmup: Annotated[int, NON_NEGATIVE]
    max_nonfinite_steps: Annotated[int, POSITIVE]
    default_hdfs_dir: str | None
    del_local_ckpt_after_load: bool
    default_local_dir: str
    remove_previous_ckpt_in_save: bool
    max_actor_ckpt_to_keep: Annotated[int | None, POSITIVE_OR_NULL]
    max_critic_ckpt_to_keep: Annotated[int | None, POSITIVE_OR_NULL]
    ray_wait_register_center_timeout: Annotated[int, POSITIVE]
    ray_call_timeout: Annotated[float, POSITIVE_FLOAT]
    ray_stall_timeout: Annotated[float, POSITIVE_FLOAT]
    verbose_engine_logs: bool
    device: str
    dry_run: bool
    device_memory_gb: float | None
    staleness: int
    rollout_drift_warn: Annotated[float, POSITIVE_FLOAT]
    controller_nsight_options: dict[str, Any]
    worker_nsight_options: dict[str, Any]
    esi_redundant_time: int
    use_legacy_worker_impl: str
    use_v1: bool
    v1: TrainerV1Config  # verl's v1 trainer modes (schema_async)


@dataclass(frozen=True)
class GlobalProfilerConfig(BaseConfig):
    """`global_profiler`."""

    tool: str | None
    steps: list[int] | None
    profile_continuous_steps: bool
    save_path: str | None
    global_tool_config: dict[str, Any]


@dataclass(frozen=True)
class RayInitConfig(BaseConfig):
    """`ray_init`."""

    num_cpus: Annotated[int | None, POSITIVE_OR_NULL]
    timeline_json_file: str | None


@dataclass(frozen=True)
class RayRuntimeEnvConfig(BaseConfig):
    """`ray_kwargs.ray_init.runtime_env` (verl's worker interpreter: not supported yet)."""

    py_executable: str | None


@dataclass(frozen=True)
class RayKwargsInitConfig(BaseConfig):
    """`ray_kwargs.ray_init`."""

    num_cpus: int | None
    runtime_env: RayRuntimeEnvConfig


@dataclass(frozen=True)
class RayKwargsConfig(BaseConfig):
    """`ray_kwargs`: verl's newer spelling of `ray_init` (copied onto it)."""

    ray_init: RayKwargsInitConfig
    timeline_json_file: str | None


@dataclass(frozen=True)
class RewardLoopRolloutConfig(RewardEngineConfig):
    """`reward.reward_model.rollout`: the same engine settings in verl's newer group, and a few more."""

    pipeline_model_parallel_size: int
    layered_summon: bool
    scheduling_policy: str
    full_determinism: bool
    seed: int
    multi_stage_wake_up: bool
    ignore_eos: bool
    temperature: float
    top_k: int
    top_p: float
    do_sample: bool
    n: int
    quantization: str | None
    quantization_config_file: str | None
    mtp: Any


@dataclass(frozen=True)
class FileObjectConfig(BaseConfig):
    """A Python object in a file: `reward.custom_reward_function` (copied onto `custom_reward_function`) and
    `reward.reward_manager.module` (a manager class of the user's: not supported yet)."""

    path: str | None
    name: str


@dataclass(frozen=True)
class RewardManagerRefConfig(BaseConfig):
    """`reward.reward_manager`; `name` is copied onto `reward_model.reward_manager`."""

    source: str
    name: str
    module: FileObjectConfig


@dataclass(frozen=True)
class RewardModelRefConfig(BaseConfig):
    """`reward.reward_model`: verl's newer spelling of the reward-model keys (copied onto `reward_model.*`)."""

    enable: bool
    enable_resource_pool: bool
    n_gpus_per_node: int
    nnodes: int
    model_path: str | None
    rollout: RewardLoopRolloutConfig


@dataclass(frozen=True)
class RewardConfig(BaseConfig):
    """`reward`: verl's newer reward group; what rlpost reads is copied onto `reward_model` and
    `custom_reward_function`."""

    num_workers: int
    custom_reward_function: FileObjectConfig
    compute_score_kwargs: dict[str, Any]
    reward_manager: RewardManagerRefConfig
    reward_model: RewardModelRefConfig
    sandbox_fusion: SandboxFusionConfig


@dataclass(frozen=True)
class PPOTrainerConfig(BaseConfig):
    """The whole composed `ppo_trainer` config."""

    data: DataConfig
    actor_rollout_ref: ActorRolloutRefConfig
    critic: CriticConfig
    reward_model: RewardModelConfig
    custom_reward_function: CustomRewardFunctionConfig
    algorithm: AlgorithmConfig
    trainer: TrainerConfig
    ray_init: RayInitConfig
    global_profiler: GlobalProfilerConfig
    ray_kwargs: RayKwargsConfig
    reward: RewardConfig
    reward_manager: RewardManagerRefConfig  # verl's earlier spelling of reward.reward_manager (copied onto it)
    distillation: DistillationConfig
    # verl's groups for features not built (unsupported.UNBUILT_GROUPS): verl's defaults, never read
    transfer_queue: dict[str, Any]
    skip: dict[str, Any]
