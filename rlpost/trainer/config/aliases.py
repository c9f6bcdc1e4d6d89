"""Deprecated keys: each is accepted with a `ConfigWarning` and copied onto its new name.

Three kinds, all applied in place on the composed DictConfig before type checking:
- renamed keys, whose old name defaults to an interpolation of the new one (`contents:
  ${.save_contents}`); an old key that is no longer an interpolation was set by the user.
- global micro-batch sizes (`ppo_micro_batch_size`), turned into per-device sizes.
- old shapes: `rollout.multi_turn=true`, `trainer.logger=console`, `remove_previous_ckpt_in_save`.
"""

from omegaconf import DictConfig, OmegaConf

from rlpost.trainer.config.defaults import default_of, package_defaults
from rlpost.trainer.config.errors import ConfigError, warn

ARR = "actor_rollout_ref"

# (parent, old name, new name relative to parent): the old name is an interpolation of the new one.
RENAMED: tuple[tuple[str, str, str], ...] = (
    (f"{ARR}.actor.checkpoint", "contents", "save_contents"),
    (f"{ARR}.actor.optim", "warmup_style", "lr_scheduler"),
    ("critic.optim", "warmup_style", "lr_scheduler"),
    ("reward_model.model.fsdp_config", "min_num_params", "wrap_policy.min_num_params"),
    (f"{ARR}.rollout.multi_turn", "max_turns", "max_assistant_turns"),
)

# (old key, new key): the old key (default null) moved elsewhere; a value set there is copied over.
MOVED: tuple[tuple[str, str], ...] = (
    (f"{ARR}.rollout.tool_kwargs.tools_config_file", f"{ARR}.rollout.multi_turn.tool_config_path"),
    (f"{ARR}.rollout.interaction_config_file", f"{ARR}.rollout.multi_turn.interaction_config_path"),
)

# The reward-loop engine keys rlpost has under reward_model.rollout (verl spells the group two other ways too).
REWARD_ENGINE_KEYS = ("name", "prompt_length", "response_length", "tensor_model_parallel_size",
                      "gpu_memory_utilization", "max_model_len")

# (synonym, key): two spellings of one setting, both current in verl; the synonym defaults to an
# interpolation of the key, and a value set on it is copied onto the key without a warning (both set to
# different values is an error).
SYNONYMS: tuple[tuple[str, str], ...] = (
    ("data.shuffle", "data.train_shuffle"),
    ("data.validation_shuffle", "data.val_shuffle"),
    (f"{ARR}.model.external_lib", f"{ARR}.model.external_libs"),
    (f"{ARR}.actor.use_remove_padding", f"{ARR}.model.use_remove_padding"),
    (f"{ARR}.actor.use_fused_kernels", f"{ARR}.model.use_fused_kernels"),
    (f"{ARR}.actor.optim.clip_grad", f"{ARR}.actor.grad_clip"),
    ("critic.optim.clip_grad", "critic.grad_clip"),
    # verl's newer `reward` group (rlpost reads the reward_model / custom_reward_function spellings)
    ("reward.num_workers", "reward_model.num_workers"),
    ("reward.custom_reward_function.path", "custom_reward_function.path"),
    ("reward.custom_reward_function.name", "custom_reward_function.name"),
    ("reward.reward_manager.name", "reward_model.reward_manager"),
    *((f"reward.reward_model.{key}", f"reward_model.{key}")
      for key in ("enable", "enable_resource_pool", "n_gpus_per_node", "nnodes")),
    ("reward.reward_model.model_path", "reward_model.model.path"),
    ("reward_model.model_path", "reward_model.model.path"),  # verl's transitional spelling
    *((f"{spelling}.{key}", f"reward_model.rollout.{key}")
      for spelling in ("reward_model.inference", "reward.reward_model.rollout") for key in REWARD_ENGINE_KEYS),
    *((f"reward.sandbox_fusion.{key}", f"reward_model.sandbox_fusion.{key}")
      for key in ("url", "max_concurrent", "memory_limit_mb")),
    *((f"critic.fsdp.{key}", f"critic.model.fsdp_config.{key}")
      for key in ("param_offload", "optimizer_offload", "offload_policy", "wrap_policy.min_num_params",
                  "reshard_after_forward", "fsdp_size", "forward_prefetch", "model_dtype", "offload.param.target",
                  "offload.optimizer.target", "offload.disk.path", "offload.disk.chunk_size_mb",
                  "offload.disk.cleanup_on_exit", "use_orig_params", "strategy", "ulysses_sequence_parallel_size",
                  "entropy_from_logits_with_chunking", "entropy_from_logits_chunk_size", "use_torch_compile",
                  "entropy_checkpointing", "forward_only", "use_no_sync_for_gradient_accumulation", "pad_to_length",
                  "pad_to_length_bucket", "full_determinism", "seed", "qat.enable", "qat.mode", "qat.group_size",
                  "qat.ignore_patterns", "qat.activation_observer", "qat.quantization_config_path")),
    *((f"{ARR}.actor.policy_loss.{key}", f"{ARR}.actor.{key}") for key in ("tau_pos", "tau_neg")),
    # verl's role-level spelling of the engine's pad_to_length
    *((f"{ARR}.{role}.pad_to_length", f"{ARR}.{role}.fsdp_config.pad_to_length") for role in ("actor", "ref")),
    # verl's engine `dtype` is the mixed-precision compute dtype
    *((f"{group}.dtype", f"{group}.mixed_precision.param_dtype")
      for group in (f"{ARR}.actor.fsdp_config", f"{ARR}.ref.fsdp_config", "critic.model.fsdp_config")),
    ("critic.fsdp.dtype", "critic.model.fsdp_config.mixed_precision.param_dtype"),
    *((f"{optim}.lr_scheduler_type", f"{optim}.lr_scheduler") for optim in (f"{ARR}.actor.optim", "critic.optim")),
    # verl's copies of rollout.n in the actor and reference groups
    *((f"{ARR}.{role}.rollout_n", f"{ARR}.rollout.n") for role in ("actor", "ref")),
    # verl's per-tool spellings of a role's profiler keys
    *((f"{group}.profiler.tool_config.{tool}.discrete", f"{group}.profiler.discrete")
      for group in (f"{ARR}.actor", f"{ARR}.ref", "critic") for tool in ("torch", "nsys")),
    *((f"{group}.profiler.tool_config.torch_memory.trace_alloc_max_entries",
       "global_profiler.global_tool_config.torch_memory.trace_alloc_max_entries")
      for group in (f"{ARR}.actor", f"{ARR}.ref", "critic")),
    # verl's earlier top-level spelling of reward.reward_manager
    ("reward_manager.source", "reward.reward_manager.source"),
    ("reward_manager.name", "reward_model.reward_manager"),
    ("reward_manager.module.path", "reward.reward_manager.module.path"),
    ("reward_manager.module.name", "reward.reward_manager.module.name"),
    ("ray_kwargs.ray_init.num_cpus", "ray_init.num_cpus"),
    ("ray_kwargs.timeline_json_file", "ray_init.timeline_json_file"),
    (f"{ARR}.rollout.checkpoint_engine.update_weights_bucket_megabytes",
     f"{ARR}.rollout.update_weights_bucket_megabytes"),
    # verl's engine-level Ulysses size (its role-level key is marked deprecated there, but both are read)
    (f"{ARR}.actor.fsdp_config.ulysses_sequence_parallel_size", f"{ARR}.actor.ulysses_sequence_parallel_size"),
    (f"{ARR}.ref.fsdp_config.ulysses_sequence_parallel_size", f"{ARR}.ref.ulysses_sequence_parallel_size"),
    ("critic.model.fsdp_config.ulysses_sequence_parallel_size", "critic.ulysses_sequence_parallel_size"),
    # verl's engine-level spellings of the log-prob pass's knobs (the critic's stay refused: it has no log-probs)
    *((f"{ARR}.{role}.fsdp_config.{key}", f"{ARR}.{role}.{key}") for role in ("actor", "ref")
      for key in ("entropy_from_logits_with_chunking", "entropy_from_logits_chunk_size", "use_torch_compile",
                  "entropy_checkpointing")),
)

# (parent, old global micro-batch, new per-device micro-batch).
GLOBAL_MICRO_BATCH: tuple[tuple[str, str, str], ...] = (
    (f"{ARR}.actor", "ppo_micro_batch_size", "ppo_micro_batch_size_per_gpu"),
    (f"{ARR}.rollout", "log_prob_micro_batch_size", "log_prob_micro_batch_size_per_gpu"),
    (f"{ARR}.ref", "log_prob_micro_batch_size", "log_prob_micro_batch_size_per_gpu"),
    ("critic", "ppo_micro_batch_size", "ppo_micro_batch_size_per_gpu"),
    ("critic", "forward_micro_batch_size", "forward_micro_batch_size_per_gpu"),
    ("reward_model", "micro_batch_size", "micro_batch_size_per_gpu"),
)


def apply_aliases(cfg: DictConfig) -> dict[str, str]:
    """Map every deprecated key set in `cfg` onto its new key (in place), warning once per key.

    Returns {rlpost's key: the synonym the user set} for every synonym copied, so later messages about the
    key can name the spelling the user wrote."""
    _multi_turn_flag(cfg)
    for parent, old, new in RENAMED:
        _renamed(cfg, parent, old, new)
    for old, new in MOVED:
        _moved(cfg, old, new)
    spelled: dict[str, str] = {}
    for synonym, key in SYNONYMS:  # two synonyms of one key: the first one set names it
        if _synonym(cfg, synonym, key, spelled.get(key)):
            spelled.setdefault(key, synonym)
    for parent, old, new in GLOBAL_MICRO_BATCH:
        _global_micro_batch(cfg, parent, old, new)
    _sanity_check_flag(cfg)
    _tis_cap(cfg)
    _logger_string(cfg)
    _remove_previous_ckpt(cfg)
    if OmegaConf.select(cfg, "data.val_batch_size", default=None) is not None:
        warn("data.val_batch_size is deprecated; leave it null to validate on the whole set at once.")
    return spelled


def _renamed(cfg: DictConfig, parent: str, old: str, new: str) -> None:
    node = OmegaConf.select(cfg, parent, default=None)
    if not isinstance(node, DictConfig) or old not in node or OmegaConf.is_interpolation(node, old):
        return
    value = node[old]
    _no_conflict(node, parent, old, value, new, value)
    warn(f"{parent}.{old} is deprecated; its value {value!r} was copied onto {parent}.{new} (use that key).")
    OmegaConf.update(node, new, value, merge=False)
    node[old] = "${." + new + "}"


def _moved(cfg: DictConfig, old: str, new: str) -> None:
    value = OmegaConf.select(cfg, old, default=None)
    if value is None:
        return
    warn(f"{old} is deprecated; its value {value!r} was copied onto {new} (use that key).")
    OmegaConf.update(cfg, new, value, merge=False)
    OmegaConf.update(cfg, old, None, merge=False)


def _synonym(cfg: DictConfig, synonym: str, key: str, earlier: str | None = None) -> bool:
    """Copy the synonym's value onto `key` when the user set it; True when it was copied. `earlier`: another
    synonym of `key` already copied onto it (a disagreement names that spelling, not `key`)."""
    parent, _, name = synonym.rpartition(".")
    node = OmegaConf.select(cfg, parent, default=None)
    if not isinstance(node, DictConfig) or name not in node:
        return False
    # unset while it still interpolates its key; a value of the user's may itself be an interpolation
    # (`reward.reward_model.model_path=${actor_rollout_ref.model.path}`): that one is copied, resolved
    if OmegaConf.is_interpolation(node, name) and _raw(node, name) == _raw(
            OmegaConf.select(package_defaults(), parent, default=None), name):
        return False
    value = node[name]
    key_parent, _, key_name = key.rpartition(".")
    holder = OmegaConf.select(cfg, key_parent, default=None)
    if isinstance(holder, DictConfig) and key_name in holder and not OmegaConf.is_interpolation(holder, key_name):
        current = holder[key_name]
        if not _same(current, value) and (earlier is not None or current != default_of(key)):
            other = earlier or key
            raise ConfigError(f"{synonym}={value!r} and {other}={current!r} are two spellings of one setting and "
                              f"disagree; set one of them, e.g. {other}={current!r}.")
    OmegaConf.update(cfg, key, value, merge=False)
    node[name] = "${" + key + "}"
    return True


_DTYPE_NAMES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def _same(a: object, b: object) -> bool:
    """Equal values, a dtype's short and long names counting as one (`bf16` and `bfloat16`)."""
    return a == b or (isinstance(a, str) and isinstance(b, str) and _DTYPE_NAMES.get(a, a) == _DTYPE_NAMES.get(b, b))


def _raw(node: object, name: str) -> object:
    """The value of `node.name` as written (an interpolation unresolved), or None."""
    if not isinstance(node, DictConfig) or name not in node:
        return None
    return node._get_node(name)._value()  # OmegaConf has no public accessor of the written value


def _sanity_check_flag(cfg: DictConfig) -> None:
    key = f"{ARR}.rollout.multi_turn.enable_tokenization_sanity_check"
    flag = OmegaConf.select(cfg, key, default=None)
    if flag is None:
        return
    mode = "strict" if flag else "disable"
    warn(f"{key}={flag} is deprecated; mapped onto {ARR}.rollout.multi_turn.tokenization_sanity_check_mode={mode}.")
    OmegaConf.update(cfg, f"{ARR}.rollout.multi_turn.tokenization_sanity_check_mode", mode, merge=False)
    OmegaConf.update(cfg, key, None, merge=False)


def _tis_cap(cfg: DictConfig) -> None:
    key = f"{ARR}.actor.tis_imp_ratio_cap"
    cap = OmegaConf.select(cfg, key, default=-1)
    if cap is None or cap <= 0:
        return
    corr = "algorithm.rollout_correction"
    warn(f"{key}={cap} is deprecated; mapped onto {corr}.rollout_is=token {corr}.rollout_is_threshold={cap} "
         "(use those keys).")
    OmegaConf.update(cfg, f"{corr}.rollout_is", "token", merge=False)
    OmegaConf.update(cfg, f"{corr}.rollout_is_threshold", float(cap), merge=False)
    OmegaConf.update(cfg, key, -1, merge=False)


def _global_micro_batch(cfg: DictConfig, parent: str, old: str, new: str) -> None:
    node = OmegaConf.select(cfg, parent, default=None)
    if not isinstance(node, DictConfig) or node.get(old) is None:
        return
    value, devices = node[old], _devices(cfg)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0 or value % devices:
        valid = max(devices, round(value / devices) * devices) if isinstance(value, int) else devices
        raise ConfigError(
            f"{parent}.{old}={value!r} (deprecated, global) must be a positive multiple of the "
            f"{devices} devices; use {parent}.{new}={max(1, valid // devices)} instead."
        )
    _no_conflict(node, parent, old, value, new, value // devices)
    warn(
        f"{parent}.{old}={value} is deprecated (global); set {parent}.{new}={value // devices} "
        f"(= {value} / {devices} devices) instead. Mapped."
    )
    node[new] = value // devices
    node[old] = None


def _no_conflict(node: DictConfig, parent: str, old: str, old_value: object, new: str, mapped: object) -> None:
    """A deprecated key never overrides an explicitly set new key: both set to different values is an error."""
    target = OmegaConf.select(node, new, default=None)
    leaf_parent, _, leaf = f"{parent}.{new}".rpartition(".")
    holder = OmegaConf.select(node._get_root(), leaf_parent) if "." in new else node
    if OmegaConf.is_interpolation(holder, leaf) or target is None:
        return
    if target != default_of(f"{parent}.{new}") and target != mapped:
        raise ConfigError(
            f"{parent}.{old}={old_value!r} (deprecated) and {parent}.{new}={target!r} are both set and disagree; "
            f"remove {parent}.{old} and keep {parent}.{new}={target!r}."
        )


def _devices(cfg: DictConfig) -> int:
    nnodes = OmegaConf.select(cfg, "trainer.nnodes", default=1)
    per_node = OmegaConf.select(cfg, "trainer.n_gpus_per_node", default=1)
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (nnodes, per_node)):
        raise ConfigError(
            f"trainer.nnodes={nnodes!r} and trainer.n_gpus_per_node={per_node!r} must be integers >= 1; "
            "use trainer.nnodes=1 trainer.n_gpus_per_node=1."
        )
    return nnodes * per_node


def _multi_turn_flag(cfg: DictConfig) -> None:
    rollout = OmegaConf.select(cfg, f"{ARR}.rollout", default=None)
    if not isinstance(rollout, DictConfig) or "multi_turn" not in rollout:
        return
    flag = rollout.multi_turn
    if isinstance(flag, bool) or flag is None:
        key = f"{ARR}.rollout.multi_turn"
        warn(f"{key}={flag} is deprecated; mapped onto {key}.enable={bool(flag)} (use that key).")
        group = OmegaConf.to_container(OmegaConf.select(package_defaults(), key), resolve=False)
        group["enable"] = bool(flag)
        rollout.multi_turn = group


def _logger_string(cfg: DictConfig) -> None:
    logger = OmegaConf.select(cfg, "trainer.logger", default=None)
    if isinstance(logger, str):  # `trainer.logger=console` is a common verl spelling
        cfg.trainer.logger = [logger]


def _remove_previous_ckpt(cfg: DictConfig) -> None:
    if OmegaConf.select(cfg, "trainer.remove_previous_ckpt_in_save", default=False) is not True:
        return
    warn(
        "trainer.remove_previous_ckpt_in_save=true is deprecated; mapped onto "
        "trainer.max_actor_ckpt_to_keep=1 trainer.max_critic_ckpt_to_keep=1 (use those keys)."
    )
    for key in ("max_actor_ckpt_to_keep", "max_critic_ckpt_to_keep"):
        if cfg.trainer.get(key) is None:
            cfg.trainer[key] = 1
    cfg.trainer.remove_previous_ckpt_in_save = False
