"""The one table of config keys whose feature is not built yet.

A key set to a refused value fails at start-up with "not supported yet: <key>=<value>". When you
build a feature, delete its row here (and its "Not supported yet" note in the YAML comment).
"""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf

from rlpost.trainer.config.errors import ConfigError

ARR = "actor_rollout_ref"


@dataclass(frozen=True)
class Refusal:
    """Either `only` (the accepted values, all else refused) or `never` (the refused values)."""

    only: tuple[Any, ...] | None = None
    never: tuple[Any, ...] | None = None

    def refuses(self, value: Any) -> bool:
        """True when `value` (or, for a list, any of its entries) needs the unbuilt feature."""
        if self.never is not None:
            items = value if isinstance(value, list) else [value]
            return any(item in self.never for item in items)
        return value not in self.only


def only(*values: Any) -> Refusal:
    """Accept just these values (usually the default: the feature off)."""
    return Refusal(only=values)


def never(*values: Any) -> Refusal:
    """Refuse these values; all others are built."""
    return Refusal(never=values)


# Feature areas named in the refusal message, by key prefix (the first match wins).
AREAS: tuple[tuple[str, str], ...] = (
    (f"{ARR}.rollout.multi_turn.completion_callback", "the multi-turn completion callback"),
    (f"{ARR}.rollout.agent.custom_async_server", "the custom async server"),
    ("trainer.v1.trainer_mode", "verl's colocate_async trainer mode"),
    ("trainer.v1.sampler.sampler_kwargs", "a sampler of your own"),
    ("trainer.v1.sampler", "refilling failed groups from a synchronous generation"),
    ("reward.reward_manager", "a reward-manager class of your own"),
    ("lora", "LoRA"),
    ("fsdp_config.qat", "quantization-aware training"),
    ("fsdp_config.strategy", "verl's fsdp_turbo engine"),
    ("fsdp_config.pad_to_length", "padding packed micro-batches to a length bucket"),
    ("fsdp_config.offload.", "per-state offloading"),
    ("quantization", "quantized rollout"),
    ("fused_kernel", "fused kernels"),
    ("critic.model.fsdp_config.entropy_", "the critic's entropy chunking/checkpointing (it has no log-prob pass)"),
    ("critic.model.fsdp_config.use_torch_compile", "the critic's torch.compile (it has no log-prob pass)"),
    ("torch_compile", "torch.compile"),
    ("entropy_", "entropy chunking/checkpointing"),
    ("activation_offload", "activation offload"),
    ("use_shm", "shared-memory loading"),
    ("megatron", "Megatron"),
    ("modules_to_save", "fully trained modules beside LoRA adapters"),
    ("image_patch_size", "multi-modal data"),
    ("checkpoint.strict", "non-strict checkpoint loading"),
    ("prefix_grouper", "the prefix grouper"),
    ("critic.model.use_liger", "Liger in the critic"),
    ("critic.model.custom_chat_template", "a chat template of the critic's own"),
    ("hf_config_path", "a separate HF config folder"),
    ("full_determinism", "batch-invariant (bit-reproducible) sampling in the engine"),
    ("pipeline_model_parallel_size", "pipeline parallelism in the engine"),
    ("logprobs_mode", "another log-prob mode of the engine"),
    ("scheduling_policy", "priority scheduling in the engine"),
    ("routing_replay", "MoE router replay"),
    ("router_replay", "MoE router replay"),
    ("moe_load_balance", "MoE load-balance metrics"),
    ("trtllm", "the TensorRT-LLM engine"),
    ("function_tool_path", "plain functions as tools"),
    ("num_repeat_rollouts", "repeated multi-turn rollouts"),
    ("custom_backend_module", "a weight-sync backend of your own"),
    ("py_executable", "a separate Python interpreter for the workers"),
    ("fire_sampling", "FIRE sampling"),
    ("profiler.tool_config.npu", "Ascend NPU profiling"),
    ("stack_depth", "a stack depth for CUDA memory snapshots"),
    ("global_profiler.global_tool_config.torch_memory", "other CUDA memory-snapshot recorder settings"),
    ("sum_pi_squared_checkpointing", "recomputing the sum of squared probabilities in the backward"),
    ("reward_loop_", "verl's reward loop (rlpost scores through its reward manager and reward-model worker)"),
)

ENGINE_KEYS = (f"{ARR}.actor.fsdp_config", f"{ARR}.ref.fsdp_config", "critic.model.fsdp_config")

_PROFILED = (f"{ARR}.actor", f"{ARR}.ref", "critic")

NOT_SUPPORTED_YET: dict[str, Refusal] = {
    **{f"{group}.profiler.tool_config.npu.{key}": only(off) for group in _PROFILED
       for key, off in (("contents", []), ("level", "level0"), ("analysis", True), ("discrete", False))},
    **{f"{group}.profiler.tool_config.torch_memory.stack_depth": only(32) for group in _PROFILED},
    "global_profiler.global_tool_config.torch_memory.stack_depth": only(32),
    "global_profiler.global_tool_config.torch_memory.context": only("all"),
    "global_profiler.global_tool_config.torch_memory.stacks": only("all"),
    "global_profiler.global_tool_config.torch_memory.kw_args": only({}),
    f"{ARR}.actor.sum_pi_squared_checkpointing": only(False),
    "reward_model.reward_loop_source": only("register"),
    "reward_model.reward_loop_module_path": only(None),
    "reward_model.reward_loop_class_name": only(None),
    f"{ARR}.model.hf_config_path": only(None),
    f"{ARR}.model.modules_to_save": only(None),
    "data.image_patch_size": only(14),
    f"{ARR}.actor.strategy": never("megatron"),
    f"{ARR}.actor.checkpoint.async_save": only(False),
    f"{ARR}.actor.checkpoint.strict": only(True),
    f"{ARR}.actor.use_prefix_grouper": only(False),
    f"{ARR}.ref.strategy": never("megatron"),
    f"{ARR}.ref.model": only(None),
    f"{ARR}.rollout.load_format": never("megatron", "dummy_megatron"),
    f"{ARR}.rollout.use_fire_sampling": only(False),
    f"{ARR}.rollout.full_determinism": only(False),
    f"{ARR}.rollout.pipeline_model_parallel_size": only(1),
    f"{ARR}.rollout.logprobs_mode": only("processed_logprobs"),
    f"{ARR}.rollout.scheduling_policy": only("fcfs"),
    f"{ARR}.rollout.enable_rollout_routing_replay": only(False),
    f"{ARR}.rollout.engine_kwargs.trtllm": only({}),
    f"{ARR}.rollout.multi_turn.function_tool_path": only(None),
    f"{ARR}.rollout.multi_turn.num_repeat_rollouts": only(None),
    f"{ARR}.rollout.checkpoint_engine.custom_backend_module": only(None),
    f"{ARR}.rollout.data_parallel_size": only(1),
    f"{ARR}.rollout.expert_parallel_size": only(1),
    f"{ARR}.rollout.quantization": only(None),
    f"{ARR}.rollout.quantization_config_file": only(None),
    "trainer.v1.trainer_mode": never("colocate_async"),
    "trainer.v1.sampler.sync_refill_failed_groups": only(False),
    "trainer.v1.sampler.sampler_kwargs": only({}),
    f"{ARR}.rollout.checkpoint_engine.backend": only("naive"),
    f"{ARR}.rollout.trace.backend": only(None),
    f"{ARR}.rollout.multi_turn.completion_callback": only(None),
    f"{ARR}.rollout.agent.custom_async_server.path": only(None),
    f"{ARR}.rollout.agent.custom_async_server.name": only(None),
    "data.datagen.path": only(None),
    "data.datagen.name": only(None),
    "critic.strategy": never("megatron"),
    "critic.checkpoint.async_save": only(False),
    "critic.checkpoint.strict": only(True),
    "critic.model.hf_config_path": only(None),
    "critic.model.custom_chat_template": only(None),
    "critic.model.use_liger": only(False),
    "critic.model.use_fused_kernels": only(False),
    "reward_model.strategy": never("megatron"),
    f"{ARR}.actor.router_replay.mode": never("R3"),  # R3 needs the engine to report the experts it routed to
    f"{ARR}.actor.router_replay.record_file": only(None),
    f"{ARR}.actor.router_replay.replay_file": only(None),
    "trainer.logger": never("vemlp_wandb"),
    "trainer.default_hdfs_dir": only(None),
    "trainer.esi_redundant_time": only(0),
    "ray_kwargs.ray_init.runtime_env.py_executable": only(None),
    **{f"critic.model.fsdp_config.{key}": only(False)
       for key in ("entropy_from_logits_with_chunking", "use_torch_compile", "entropy_checkpointing")},
    **{f"{group}.mixed_precision.{key}": only("fp32", "float32") for group in ENGINE_KEYS
       for key in ("reduce_dtype", "buffer_dtype")},
    **{f"{group}.{key}": only(off) for group in ENGINE_KEYS
       for key, off in (("pad_to_length", False), ("qat.enable", False), ("offload.param.target", None),
                        ("offload.optimizer.target", None))},
    **{f"{group}.strategy": never("fsdp_turbo") for group in ENGINE_KEYS},
}

# Groups of verl's keys whose feature is not built, kept with verl's defaults in the YAML so verl's scripts and
# `--cfg job` find them: any leaf set away from its default is refused, naming that leaf. Their typed field is a
# plain mapping, as nothing reads them.
UNBUILT_GROUPS: dict[str, str] = {
    "transfer_queue": "the transfer queue",
    "skip": "the rollout skip/cache manager",
    "trainer.v1.colocate_async": "verl's colocate_async trainer mode",
    "trainer.v1.separate_async.hybrid_rollout": "switching separate_async rollout devices to training",
    "trainer.v1.sampler.custom_sampler": "a sampler of your own",
    f"{ARR}.rollout.prometheus": "Prometheus export of rollout-server metrics",
    f"{ARR}.rollout.disaggregation": "prefill/decode disaggregation",
    f"{ARR}.model.tiled_mlp": "tiled MLP",
    f"{ARR}.model.mtp": "multi-token prediction",
    f"{ARR}.rollout.mtp": "multi-token prediction",
    "critic.model.tiled_mlp": "tiled MLP",
    "critic.model.mtp": "multi-token prediction",
    f"{ARR}.ref.router_replay": "MoE router replay in the reference (it routes as the model does)",
    f"{ARR}.actor.qat": "quantization-aware training",
    "critic.model.fsdp_config.turbo_config": "verl's fsdp_turbo engine",
    **{f"{group}.turbo_config": "verl's fsdp_turbo engine"
       for group in (f"{ARR}.actor.fsdp_config", f"{ARR}.ref.fsdp_config", "critic.fsdp")},
}

# Keys accepted with a one-line notice when set away from their default: they choose between verl-internal
# implementations rlpost does not have, and rlpost's single implementation behaves as described.
NOTICES: dict[str, str] = {
    f"{ARR}.rollout.multi_stage_wake_up": "rlpost's hybrid engines (vLLM, SGLang) always wake the weights before "
                                          "the sync and the KV cache after it",
    f"{ARR}.rollout.skip_tokenizer_init": "rlpost always passes token ids to the engine",
    f"{ARR}.rollout.multi_turn.use_inference_chat_template": "agent loops keep the model's tokens as generated and "
                                                             "render the other messages with the tokenizer's chat "
                                                             "template; the key has no effect",
    f"{ARR}.rollout.agent.num_workers": "rlpost runs the agent loops of each rollout worker on one asyncio event "
                                        "loop inside that worker; the number of agent-loop workers has no effect",
    f"{ARR}.rollout.layered_summon": "the weight sync gathers one bucket of update_weights_bucket_megabytes at a "
                                     "time whatever its value",
    f"{ARR}.actor.fsdp_config.use_orig_params": "FSDP2 always keeps the original parameters",
    f"{ARR}.ref.fsdp_config.use_orig_params": "FSDP2 always keeps the original parameters",
    "critic.model.fsdp_config.use_orig_params": "FSDP2 always keeps the original parameters",
    "critic.model.fsdp_config.entropy_from_logits_chunk_size": "the critic has no log-prob pass, so no entropy "
                                                               "chunks",
    f"{ARR}.ref.fsdp_config.optimizer_offload": "the reference has no optimizer",
    f"{ARR}.ref.fsdp_config.use_no_sync_for_gradient_accumulation": "the reference never trains",
    "trainer.use_legacy_worker_impl": "rlpost has one worker implementation, used for every value",
    "trainer.use_v1": "rlpost has one trainer, used for every value",
    "trainer.controller_nsight_options": "the controller is the process you launch: run it under `nsys profile` "
                                         "with these options yourself to trace it",
    "global_profiler.global_tool_config.nsys.controller_nsight_options": "the controller is the process you launch: "
                                                                         "run it under `nsys profile` with these "
                                                                         "options yourself to trace it",
    "reward_model.use_reward_loop": "rule-based scores come from the reward manager (in-process, or worker "
                                    "processes once a sample takes over 0.5 s) and a discriminative "
                                    "reward_model.model from rlpost's reward-model worker (an FSDP forward on the "
                                    "trainer's devices), the same scores as verl's reward loop; "
                                    "reward_model.rollout.* and reward_model.num_workers are not used",
    "reward_model.rollout": "verl's reward-loop engine serves the reward model; rlpost's reward model is an FSDP "
                            "forward on the trainer's devices (the same scores), so these engine settings are not "
                            "used",
    "reward.reward_model.rollout": "a discriminative reward model is an FSDP forward on the trainer's devices "
                                   "(the same scores) and uses none of these engine settings; a generative judge "
                                   "reads those that follow reward_model.rollout.* and samples with "
                                   "reward_model.judge.* (temperature, top_p, max_tokens), not the others",
    "reward_model.inference": "verl's reward-loop engine serves the reward model; rlpost's reward model is an "
                              "FSDP forward on the trainer's devices (the same scores), so these engine settings "
                              "are not used",
    "reward_model.model.use_fused_kernels": "the fused kernel replaces a language-model head's log-softmax; the "
                                            "reward model's head is one linear layer to a score, nothing to fuse",
    f"{ARR}.model.fused_kernel_options.impl_backend": "the fused log-prob is one PyTorch implementation (chunked "
                                                      "matmul + log-softmax); triton runs the same",
}


def check_not_supported(cfg: DictConfig, spelled: Mapping[str, str] | None = None) -> None:
    """Raise `ConfigError` for the first key of the table set to a value whose feature is not built.

    `spelled` maps a key to the synonym the user set it through (`apply_aliases`); the message names that
    spelling, the one to change."""
    from rlpost.trainer.config.defaults import default_of, package_defaults

    for key, refusal in NOT_SUPPORTED_YET.items():
        value = _plain(OmegaConf.select(cfg, key, default=None))
        if refusal.refuses(value):
            shown = (spelled or {}).get(key, key)
            fix = _fix(shown, refusal, value, default_of(key))
            raise ConfigError(f"not supported yet: {shown}={_show(value)} ({_area(key)} is not built); use {fix}.")
    for group, area in UNBUILT_GROUPS.items():
        changed = _first_change(_raw_tree(cfg, group), _raw_tree(package_defaults(), group), group)
        if changed is not None:
            key, value, default = changed
            fix = (f"remove the override of {key}" if isinstance(default, str) and "${" in default
                   else f"use {key}={_show(default)}")
            raise ConfigError(f"not supported yet: {key}={_show(value)} ({area} is not built); {fix}.")


# Keys a generative judge reads (rlpost.reward.judge): their notice holds for other reward models only.
JUDGE_READS = ("reward_model.use_reward_loop", "reward_model.rollout", "reward_model.inference")


def notices(cfg: DictConfig) -> list[str]:
    """One line per accepted key set away from its default whose value has no effect in rlpost."""
    from rlpost.trainer.config.defaults import default_of, package_defaults
    from rlpost.trainer.config.roles import generative_judge

    out = []
    judge = generative_judge(cfg)
    for key, meaning in NOTICES.items():
        if judge and key in JUDGE_READS:
            continue
        value, default = _plain(OmegaConf.select(cfg, key, default=None)), default_of(key)
        if value != default:
            if isinstance(value, dict) and isinstance(default, dict):
                # a group: the entries set, less those that still follow another key (its own notice names it)
                node, written = OmegaConf.select(cfg, key), OmegaConf.select(package_defaults(), key)
                value = {k: v for k, v in value.items() if default.get(k) != v
                         and not (OmegaConf.is_interpolation(node, k) and OmegaConf.is_interpolation(written, k))}
                if not value:
                    continue
            out.append(f"{key}={_show(value)} accepted: {meaning}.")
    return out


def _raw_tree(cfg: DictConfig, key: str) -> Any:
    """The subtree at `key` as written (interpolations unresolved: a verl default that follows another key
    is unchanged until the user sets it), or None."""
    node = OmegaConf.select(cfg, key, default=None)
    return OmegaConf.to_container(node, resolve=False) if OmegaConf.is_config(node) else node


def _first_change(value: Any, default: Any, key: str) -> tuple[str, Any, Any] | None:
    """(leaf key, value, default) of the first leaf of `value` that differs from `default`, or None."""
    if isinstance(value, dict) and isinstance(default, dict):
        for name in value:
            found = _first_change(value[name], default.get(name), f"{key}.{name}")
            if found is not None:
                return found
        return None
    return None if value == default else (key, value, default)


def _area(key: str) -> str:
    for part, area in AREAS:
        if part in key:
            return area
    return "this feature"


def _fix(key: str, refusal: Refusal, value: Any, default: Any) -> str:
    if refusal.never is not None and isinstance(value, list):
        return f"{key}={[v for v in value if v not in refusal.never]}"
    return f"{key}={_show(default)}"


def _plain(value: Any) -> Any:
    return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value


def _show(value: Any) -> str:
    if value is None:
        return "null"
    return str(value).lower() if isinstance(value, bool) else str(value)
