"""The one table of config keys whose feature is not built yet.

A key set to a refused value fails at start-up with "not supported yet: <key>=<value>". When you
build a feature, delete its row here (and its "Not supported yet" note in the YAML comment).
"""

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


NOT_SUPPORTED_YET: dict[str, Refusal] = {
    f"{ARR}.hybrid_engine": only(True),
    f"{ARR}.model.enable_activation_offload": only(False),
    f"{ARR}.model.use_liger": only(False),
    f"{ARR}.model.use_fused_kernels": only(False),
    f"{ARR}.model.use_shm": only(False),
    f"{ARR}.actor.strategy": never("megatron"),
    f"{ARR}.actor.use_torch_compile": only(False),
    f"{ARR}.actor.ulysses_sequence_parallel_size": only(1),
    f"{ARR}.actor.entropy_from_logits_with_chunking": only(False),
    f"{ARR}.actor.entropy_checkpointing": only(False),
    f"{ARR}.actor.fsdp_config.forward_prefetch": only(False),
    f"{ARR}.actor.profiler.discrete": only(False),
    f"{ARR}.actor.profiler.all_ranks": only(False),
    f"{ARR}.actor.profiler.ranks": only(None),
    f"{ARR}.ref.strategy": never("megatron"),
    f"{ARR}.ref.ulysses_sequence_parallel_size": only(1),
    f"{ARR}.ref.fsdp_config.forward_prefetch": only(False),
    f"{ARR}.ref.profiler.discrete": only(False),
    f"{ARR}.ref.profiler.all_ranks": only(False),
    f"{ARR}.ref.profiler.ranks": only(None),
    f"{ARR}.rollout.load_format": never("megatron", "dummy_megatron"),
    f"{ARR}.rollout.use_fire_sampling": only(False),
    f"{ARR}.rollout.multi_turn.enable": only(False),
    f"{ARR}.rollout.multi_turn.tool_config_path": only(None),
    f"{ARR}.rollout.multi_turn.completion_callback": only(None),
    f"{ARR}.rollout.tool_kwargs.tools_config_file": only(None),
    f"{ARR}.rollout.interaction_config_file": only(None),
    "data.use_shm": only(False),
    "critic.strategy": never("megatron"),
    "critic.ulysses_sequence_parallel_size": only(1),
    "critic.model.fsdp_config.forward_prefetch": only(False),
    "reward_model.strategy": never("megatron"),
    "reward_model.model.use_shm": only(False),
    "reward_model.model.use_fused_kernels": only(False),
    "reward_model.model.fsdp_config.forward_prefetch": only(False),
    "reward_model.launch_reward_fn_async": only(False),
    "reward_model.sandbox_fusion.url": only(None),
    "reward_model.profiler.discrete": only(False),
    "trainer.logger": never("vemlp_wandb"),
    "trainer.default_hdfs_dir": only(None),
    "trainer.profile_steps": only(None),
}

# Nsight option maps: any change from the package default is refused (profiling is not built).
NOT_SUPPORTED_IF_CHANGED: tuple[str, ...] = ("trainer.controller_nsight_options", "trainer.worker_nsight_options")


def check_not_supported(cfg: DictConfig) -> None:
    """Raise `ConfigError` for the first key of the table set to a value whose feature is not built."""
    from rlpost.trainer.config.defaults import default_of

    for key, refusal in NOT_SUPPORTED_YET.items():
        value = _plain(OmegaConf.select(cfg, key, default=None))
        if refusal.refuses(value):
            fix = _fix(key, refusal, value, default_of(key))
            raise ConfigError(f"not supported yet: {key}={_show(value)} (this feature is not built); use {fix}.")
    for key in NOT_SUPPORTED_IF_CHANGED:
        value, default = _plain(OmegaConf.select(cfg, key, default=None)), default_of(key)
        if value != default:
            raise ConfigError(
                f"not supported yet: {key}={value} (Nsight profiling is not built); leave it at its default."
            )


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
