"""Typed schema of `actor_rollout_ref.*` (model, actor, reference, rollout).

The YAML files under this folder hold the defaults; these dataclasses only hold the types, so a
default lives in one place. `convert.to_typed` fills them from a composed config and fails on a
missing, unknown or mistyped key.
"""

from dataclasses import dataclass
from typing import Annotated, Any

from rlpost.config.base import BaseConfig
from rlpost.config.constraints import (
    ABOVE_ONE,
    BELOW_ONE,
    BETAS,
    CLOSED_UNIT,
    MODEL_RUNNER,
    NON_NEGATIVE,
    OPEN_UNIT,
    POSITIVE,
    POSITIVE_FLOAT,
    POSITIVE_FLOAT_OR_NULL,
    POSITIVE_OR_NULL,
    TOP_K,
)


@dataclass(frozen=True)
class WrapPolicyConfig(BaseConfig):
    """`*.fsdp_config.wrap_policy`."""

    min_num_params: Annotated[int, NON_NEGATIVE]


@dataclass(frozen=True)
class MixedPrecisionConfig(BaseConfig):
    """`*.fsdp_config.mixed_precision`."""

    param_dtype: str | None
    reduce_dtype: str
    buffer_dtype: str


@dataclass(frozen=True)
class QatConfig(BaseConfig):
    """`*.fsdp_config.qat` (verl's quantization-aware training; refused when enabled)."""

    enable: bool
    mode: str
    group_size: int
    ignore_patterns: list[str]
    activation_observer: str
    quantization_config_path: str | None


@dataclass(frozen=True)
class OffloadTargetConfig(BaseConfig):
    """`*.fsdp_config.offload.{param,optimizer}`."""

    target: str | None


@dataclass(frozen=True)
class DiskOffloadConfig(BaseConfig):
    """`*.fsdp_config.offload.disk`."""

    path: str | None
    chunk_size_mb: int
    cleanup_on_exit: bool


@dataclass(frozen=True)
class OffloadConfig(BaseConfig):
    """`*.fsdp_config.offload` (verl's per-state offload targets; refused when a target is set)."""

    param: OffloadTargetConfig
    optimizer: OffloadTargetConfig
    disk: DiskOffloadConfig


@dataclass(frozen=True)
class FsdpConfig(BaseConfig):
    """`actor.fsdp_config`, `ref.fsdp_config` and `critic.model.fsdp_config`."""

    wrap_policy: WrapPolicyConfig
    param_offload: bool
    optimizer_offload: bool
    offload_policy: bool
    reshard_after_forward: bool
    fsdp_size: int
    forward_prefetch: bool
    model_dtype: str
    use_orig_params: bool
    strategy: str
    ulysses_sequence_parallel_size: int
    entropy_from_logits_with_chunking: bool
    entropy_from_logits_chunk_size: int
    use_torch_compile: bool
    entropy_checkpointing: bool
    forward_only: bool
    pad_to_length: bool
    pad_to_length_bucket: int
    turbo_config: dict[str, Any]  # not built (unsupported.UNBUILT_GROUPS)
    qat: QatConfig
    offload: OffloadConfig
    use_no_sync_for_gradient_accumulation: bool
    full_determinism: bool
    seed: int
    dtype: str | None
    mixed_precision: MixedPrecisionConfig


@dataclass(frozen=True)
class OptimConfig(BaseConfig):
    """`actor.optim` and `critic.optim`."""

    lr: Annotated[float, NON_NEGATIVE]
    lr_warmup_steps: int
    lr_warmup_steps_ratio: Annotated[float, CLOSED_UNIT]
    min_lr_ratio: Annotated[float | None, CLOSED_UNIT]
    num_cycles: Annotated[float, POSITIVE_FLOAT]
    lr_scheduler: str
    warmup_style: str
    lr_scheduler_type: str
    zero_indexed_step: bool
    total_training_steps: int
    weight_decay: Annotated[float, NON_NEGATIVE]
    betas: Annotated[list[float], BETAS]
    optimizer: str
    optimizer_impl: str
    override_optimizer_config: dict[str, Any] | None
    clip_grad: float


@dataclass(frozen=True)
class CheckpointConfig(BaseConfig):
    """`critic.checkpoint`."""

    save_contents: list[str]
    load_contents: list[str]
    async_save: bool
    strict: bool


@dataclass(frozen=True)
class ActorCheckpointConfig(CheckpointConfig):
    """`actor_rollout_ref.actor.checkpoint` (adds the deprecated `contents`)."""

    contents: list[str]


@dataclass(frozen=True)
class ProfilerConfig(BaseConfig):
    """`actor.profiler` and `ref.profiler`."""

    discrete: bool
    all_ranks: bool
    ranks: list[int] | None
    tool: str | None
    enable: bool
    save_path: str | None
    tool_config: dict[str, Any]


@dataclass(frozen=True)
class RolloutProfilerConfig(BaseConfig):
    """`actor_rollout_ref.rollout.profiler`."""

    tool: str | None
    enable: bool
    all_ranks: bool
    ranks: list[int] | None
    save_path: str | None
    tool_config: dict[str, Any]


@dataclass(frozen=True)
class PolicyLossConfig(BaseConfig):
    """`actor_rollout_ref.actor.policy_loss`."""

    loss_mode: str
    clip_cov_ratio: float
    clip_cov_lb: float
    clip_cov_ub: float
    kl_cov_ratio: float
    ppo_kl_coef: float
    dro_beta: float | None
    topr_negative_ratio_lower: float
    topr_negative_ratio_upper: float
    tau_pos: float
    tau_neg: float


@dataclass(frozen=True)
class RouterReplayConfig(BaseConfig):
    """`actor_rollout_ref.actor.router_replay`: MoE router replay (`rlpost.utils.router_replay`).

    mode: disabled, R2 (the update replays the experts the old-log-prob pass chose) or R3 (the rollout engine's;
    not built). record_file / replay_file: verl's files of recorded routing (not built; keep null).
    """

    mode: str
    record_file: str | None
    replay_file: str | None


@dataclass(frozen=True)
class FusedKernelOptionsConfig(BaseConfig):
    """`actor_rollout_ref.model.fused_kernel_options`."""

    impl_backend: str


@dataclass(frozen=True)
class LoraOptionsConfig(BaseConfig):
    """`actor_rollout_ref.model.lora`."""

    merge: bool


@dataclass(frozen=True)
class ModelConfig(BaseConfig):
    """`actor_rollout_ref.model`."""

    path: str
    external_libs: str | list[str] | None
    external_lib: str | list[str] | None
    override_config: dict[str, Any]
    enable_gradient_checkpointing: bool
    enable_activation_offload: bool
    trust_remote_code: bool
    use_remove_padding: bool
    use_liger: bool
    use_fused_kernels: bool
    fused_kernel_options: FusedKernelOptionsConfig
    use_shm: bool
    lora_rank: int
    lora_alpha: int
    target_modules: str | list[str]
    exclude_modules: str | list[str] | None
    lora_adapter_path: str | None
    modules_to_save: list[str] | None
    lora: LoraOptionsConfig
    hf_config_path: str | None
    tokenizer_path: str | None
    custom_chat_template: str | None
    tiled_mlp: dict[str, Any]  # not built (unsupported.UNBUILT_GROUPS)
    mtp: dict[str, Any]  # not built (unsupported.UNBUILT_GROUPS)


@dataclass(frozen=True)
class ActorConfig(BaseConfig):
    """`actor_rollout_ref.actor`."""

    strategy: str
    ppo_mini_batch_size: Annotated[int, POSITIVE]
    ppo_micro_batch_size: int | None
    ppo_micro_batch_size_per_gpu: int | None
    use_dynamic_bsz: bool
    ppo_max_token_len_per_gpu: Annotated[int, POSITIVE]
    grad_clip: Annotated[float, POSITIVE_FLOAT]
    clip_ratio: Annotated[float, POSITIVE_FLOAT]
    clip_ratio_low: Annotated[float, POSITIVE_FLOAT]
    clip_ratio_high: Annotated[float, POSITIVE_FLOAT]
    clip_ratio_c: Annotated[float, ABOVE_ONE]
    policy_loss: PolicyLossConfig
    tau_pos: Annotated[float, POSITIVE_FLOAT]
    tau_neg: Annotated[float, POSITIVE_FLOAT]
    tis_imp_ratio_cap: float
    freeze_vision_tower: bool
    loss_agg_mode: str
    entropy_coeff: Annotated[float, NON_NEGATIVE]
    use_kl_loss: bool
    use_torch_compile: bool
    kl_loss_coef: Annotated[float, NON_NEGATIVE]
    kl_loss_type: str
    ppo_epochs: Annotated[int, POSITIVE]
    data_loader_seed: int | None
    shuffle: bool
    ulysses_sequence_parallel_size: int
    entropy_from_logits_with_chunking: bool
    entropy_from_logits_chunk_size: Annotated[int, POSITIVE]
    entropy_checkpointing: bool
    checkpoint: ActorCheckpointConfig
    optim: OptimConfig
    fsdp_config: FsdpConfig
    profiler: ProfilerConfig
    use_fused_kernels: bool
    use_remove_padding: bool
    calculate_entropy: bool
    calculate_sum_pi_squared: bool
    sum_pi_squared_checkpointing: bool
    rollout_n: int
    use_prefix_grouper: bool
    loss_scale_factor: Annotated[float | None, POSITIVE_FLOAT_OR_NULL]
    pad_to_length: bool
    router_replay: RouterReplayConfig
    qat: dict[str, Any]  # not built (unsupported.UNBUILT_GROUPS)

    @property
    def global_batch_info(self) -> dict[str, Any]:
        """verl's extra `agg_loss` arguments a policy loss spreads into it
        (`agg_loss(..., **config.global_batch_info)`): here only `loss_scale_factor`, the constant divisor of
        seq-mean-token-sum-norm, when set. (The data-parallel and micro-batch shares are applied outside the
        loss, by the weights of `rlpost.workers.batching`.)"""
        return {} if self.loss_scale_factor is None else {"loss_scale_factor": float(self.loss_scale_factor)}


@dataclass(frozen=True)
class RefConfig(BaseConfig):
    """`actor_rollout_ref.ref`."""

    strategy: str
    rollout_n: int
    fsdp_config: FsdpConfig
    log_prob_micro_batch_size: int | None
    log_prob_micro_batch_size_per_gpu: int | None
    log_prob_use_dynamic_bsz: bool
    log_prob_max_token_len_per_gpu: Annotated[int, POSITIVE]
    ulysses_sequence_parallel_size: int
    use_torch_compile: bool
    entropy_from_logits_with_chunking: bool
    entropy_from_logits_chunk_size: Annotated[int, POSITIVE]
    entropy_checkpointing: bool
    model: dict[str, Any] | None
    profiler: ProfilerConfig
    pad_to_length: bool
    router_replay: dict[str, Any]  # not built (unsupported.UNBUILT_GROUPS)


@dataclass(frozen=True)
class EngineKwargsConfig(BaseConfig):
    """`actor_rollout_ref.rollout.engine_kwargs`."""

    swap_space: int | None
    vllm: dict[str, Any]
    sglang: dict[str, Any]
    trtllm: dict[str, Any]


@dataclass(frozen=True)
class ValKwargsConfig(BaseConfig):
    """`actor_rollout_ref.rollout.val_kwargs`: sampling used for validation."""

    top_k: Annotated[int, TOP_K]
    top_p: Annotated[float, OPEN_UNIT]
    temperature: Annotated[float, NON_NEGATIVE]
    n: Annotated[int, POSITIVE]
    do_sample: bool


@dataclass(frozen=True)
class MultiTurnConfig(BaseConfig):
    """`actor_rollout_ref.rollout.multi_turn`."""

    enable: bool
    max_assistant_turns: Annotated[int | None, POSITIVE_OR_NULL]
    max_turns: int | None
    max_user_turns: Annotated[int | None, POSITIVE_OR_NULL]
    max_parallel_calls: Annotated[int, POSITIVE]
    max_tool_response_length: Annotated[int, POSITIVE]
    tool_response_truncate_side: str
    tool_timeout_s: Annotated[float, POSITIVE_FLOAT]
    tool_config_path: str | None
    interaction_config_path: str | None
    completion_callback: str | None
    use_inference_chat_template: bool
    tokenization_sanity_check_mode: str
    enable_tokenization_sanity_check: bool | None
    format: str
    function_tool_path: str | None
    num_repeat_rollouts: int | None


@dataclass(frozen=True)
class CustomAsyncServerConfig(BaseConfig):
    """`actor_rollout_ref.rollout.agent.custom_async_server`."""

    path: str | None
    name: str | None


@dataclass(frozen=True)
class AgentConfig(BaseConfig):
    """`actor_rollout_ref.rollout.agent`: agent loops of multi-turn rollouts."""

    num_workers: int
    agent_loop_config_path: str | None
    default_agent_loop: str | None
    custom_async_server: CustomAsyncServerConfig


@dataclass(frozen=True)
class CheckpointEngineConfig(BaseConfig):
    """`actor_rollout_ref.rollout.checkpoint_engine`: how weights reach the engine."""

    backend: str
    update_weights_bucket_megabytes: int
    engine_kwargs: dict[str, Any]
    custom_backend_module: str | None


@dataclass(frozen=True)
class TraceConfig(BaseConfig):
    """`actor_rollout_ref.rollout.trace`."""

    backend: str | None
    token2text: bool
    max_samples_per_step_per_worker: int | None
    project_name: str | None
    experiment_name: str | None


@dataclass(frozen=True)
class ToolKwargsConfig(BaseConfig):
    """`actor_rollout_ref.rollout.tool_kwargs`."""

    tools_config_file: str | None


@dataclass(frozen=True)
class RolloutConfig(BaseConfig):
    """`actor_rollout_ref.rollout`."""

    name: str
    mode: str
    nnodes: int
    n_gpus_per_node: int
    temperature: Annotated[float, NON_NEGATIVE]
    top_k: Annotated[int, TOP_K]
    top_p: Annotated[float, OPEN_UNIT]
    prompt_length: int
    response_length: int
    dtype: str
    gpu_memory_utilization: Annotated[float, OPEN_UNIT]
    ignore_eos: bool
    enforce_eager: bool
    free_cache_engine: bool
    load_format: str
    tensor_model_parallel_size: Annotated[int, POSITIVE]
    data_parallel_size: int
    expert_parallel_size: int
    cudagraph_capture_sizes: list[int] | None
    enable_prefix_caching: bool
    quantization: str | None
    quantization_config_file: str | None
    mtp: dict[str, Any] | None  # follows model.mtp (not built: unsupported.UNBUILT_GROUPS)
    max_num_batched_tokens: Annotated[int, POSITIVE]
    max_model_len: Annotated[int | None, POSITIVE_OR_NULL]
    max_num_seqs: Annotated[int, POSITIVE]
    model_runner: Annotated[str | None, MODEL_RUNNER]
    log_prob_micro_batch_size: int | None
    log_prob_micro_batch_size_per_gpu: int | None
    log_prob_use_dynamic_bsz: bool
    log_prob_max_token_len_per_gpu: Annotated[int, POSITIVE]
    do_sample: bool
    n: Annotated[int, POSITIVE]
    calculate_log_probs: bool
    disable_log_stats: bool
    enable_chunked_prefill: bool
    use_fire_sampling: bool
    seed: int | None
    full_determinism: bool
    pipeline_model_parallel_size: int
    logprobs_mode: str
    scheduling_policy: str
    enable_rollout_routing_replay: bool
    moe_load_balance_metrics_interval: Annotated[int, NON_NEGATIVE]
    engine_kwargs: EngineKwargsConfig
    val_kwargs: ValKwargsConfig
    over_sample_rate: Annotated[float, BELOW_ONE]
    multi_stage_wake_up: bool
    update_weights_bucket_megabytes: Annotated[int, POSITIVE]
    checkpoint_engine: CheckpointEngineConfig
    trace: TraceConfig
    skip_rollout: bool
    skip_dump_dir: str
    skip_tokenizer_init: bool
    layered_summon: bool
    multi_turn: MultiTurnConfig
    tool_kwargs: ToolKwargsConfig
    interaction_config_file: str | None
    agent: AgentConfig
    profiler: RolloutProfilerConfig
    prometheus: dict[str, Any]  # not built (unsupported.UNBUILT_GROUPS)
    disaggregation: dict[str, Any]  # not built (unsupported.UNBUILT_GROUPS)


@dataclass(frozen=True)
class ActorRolloutRefConfig(BaseConfig):
    """`actor_rollout_ref`: the hybrid worker group."""

    hybrid_engine: bool
    nccl_timeout: Annotated[int, POSITIVE]
    model: ModelConfig
    # rollout before actor and ref: their rollout_n follows rollout.n, and a bad value is named where it was set
    rollout: RolloutConfig
    actor: ActorConfig
    ref: RefConfig
