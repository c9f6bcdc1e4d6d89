"""Typed schema of `actor_rollout_ref.*` (model, actor, reference, rollout).

The YAML files under this folder hold the defaults; these dataclasses only hold the types, so a
default lives in one place. `convert.to_typed` fills them from a composed config and fails on a
missing, unknown or mistyped key.
"""

from dataclasses import dataclass
from typing import Any


@dataclass
class WrapPolicyConfig:
    """`*.fsdp_config.wrap_policy`."""

    min_num_params: int


@dataclass
class FsdpConfig:
    """`actor.fsdp_config` and `critic.model.fsdp_config`."""

    wrap_policy: WrapPolicyConfig
    param_offload: bool
    optimizer_offload: bool
    offload_policy: bool
    reshard_after_forward: bool
    fsdp_size: int
    forward_prefetch: bool


@dataclass
class RefFsdpConfig:
    """`actor_rollout_ref.ref.fsdp_config`."""

    param_offload: bool
    reshard_after_forward: bool
    forward_prefetch: bool
    wrap_policy: WrapPolicyConfig


@dataclass
class OptimConfig:
    """`actor.optim` and `critic.optim`."""

    lr: float
    lr_warmup_steps: int
    lr_warmup_steps_ratio: float
    min_lr_ratio: float | None
    num_cycles: float
    lr_scheduler: str
    warmup_style: str
    total_training_steps: int
    weight_decay: float
    betas: list[float]


@dataclass
class CheckpointConfig:
    """`critic.checkpoint`."""

    save_contents: list[str]
    load_contents: list[str]


@dataclass
class ActorCheckpointConfig(CheckpointConfig):
    """`actor_rollout_ref.actor.checkpoint` (adds the deprecated `contents`)."""

    contents: list[str]


@dataclass
class ProfilerConfig:
    """`actor.profiler` and `ref.profiler`."""

    discrete: bool
    all_ranks: bool
    ranks: list[int] | None


@dataclass
class FusedKernelOptionsConfig:
    """`actor_rollout_ref.model.fused_kernel_options`."""

    impl_backend: str


@dataclass
class ModelConfig:
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


@dataclass
class ActorConfig:
    """`actor_rollout_ref.actor`."""

    strategy: str
    ppo_mini_batch_size: int
    ppo_micro_batch_size: int | None
    ppo_micro_batch_size_per_gpu: int | None
    use_dynamic_bsz: bool
    ppo_max_token_len_per_gpu: int
    grad_clip: float
    clip_ratio: float
    clip_ratio_low: float
    clip_ratio_high: float
    clip_ratio_c: float
    loss_agg_mode: str
    entropy_coeff: float
    use_kl_loss: bool
    use_torch_compile: bool
    kl_loss_coef: float
    kl_loss_type: str
    ppo_epochs: int
    data_loader_seed: int | None
    shuffle: bool
    ulysses_sequence_parallel_size: int
    entropy_from_logits_with_chunking: bool
    entropy_checkpointing: bool
    checkpoint: ActorCheckpointConfig
    optim: OptimConfig
    fsdp_config: FsdpConfig
    profiler: ProfilerConfig


@dataclass
class RefConfig:
    """`actor_rollout_ref.ref`."""

    strategy: str
    fsdp_config: RefFsdpConfig
    log_prob_micro_batch_size: int | None
    log_prob_micro_batch_size_per_gpu: int | None
    log_prob_use_dynamic_bsz: bool
    log_prob_max_token_len_per_gpu: int
    ulysses_sequence_parallel_size: int
    profiler: ProfilerConfig


@dataclass
class EngineKwargsConfig:
    """`actor_rollout_ref.rollout.engine_kwargs`."""

    swap_space: int | None
    vllm: dict[str, Any]
    sglang: dict[str, Any]


@dataclass
class ValKwargsConfig:
    """`actor_rollout_ref.rollout.val_kwargs`: sampling used for validation."""

    top_k: int
    top_p: float
    temperature: float
    n: int
    do_sample: bool


@dataclass
class MultiTurnConfig:
    """`actor_rollout_ref.rollout.multi_turn`."""

    enable: bool
    max_turns: int | None
    tool_config_path: str | None
    completion_callback: str | None
    use_inference_chat_template: bool
    enable_tokenization_sanity_check: bool


@dataclass
class ToolKwargsConfig:
    """`actor_rollout_ref.rollout.tool_kwargs`."""

    tools_config_file: str | None


@dataclass
class RolloutConfig:
    """`actor_rollout_ref.rollout`."""

    name: str
    temperature: float
    top_k: int
    top_p: float
    prompt_length: int
    response_length: int
    dtype: str
    gpu_memory_utilization: float
    ignore_eos: bool
    enforce_eager: bool
    free_cache_engine: bool
    load_format: str
    tensor_model_parallel_size: int
    max_num_batched_tokens: int
    max_model_len: int | None
    max_num_seqs: int
    log_prob_micro_batch_size: int | None
    log_prob_micro_batch_size_per_gpu: int | None
    log_prob_use_dynamic_bsz: bool
    log_prob_max_token_len_per_gpu: int
    do_sample: bool
    n: int
    calculate_log_probs: bool
    disable_log_stats: bool
    enable_chunked_prefill: bool
    use_fire_sampling: bool
    engine_kwargs: EngineKwargsConfig
    val_kwargs: ValKwargsConfig
    multi_turn: MultiTurnConfig
    tool_kwargs: ToolKwargsConfig
    interaction_config_file: str | None


@dataclass
class ActorRolloutRefConfig:
    """`actor_rollout_ref`: the hybrid worker group."""

    hybrid_engine: bool
    model: ModelConfig
    actor: ActorConfig
    ref: RefConfig
    rollout: RolloutConfig
