"""Valid values of the enumerated config keys. Names that select code come from its registry.

Advantage estimators, policy losses, KL estimators, loss-aggregation modes, rollout engines, reward
managers and tool-call formats are looked up in the registries the code uses, so a name registered by a user
(`@register_adv_est("my_est")` before validation) is valid, and a new built-in needs no edit here.
"""

from __future__ import annotations

from typing import Any

ARR = "actor_rollout_ref"
STRATEGIES = ("fsdp2", "fsdp", "megatron")
LR_SCHEDULERS = ("constant", "cosine")
CONTENTS = ("model", "optimizer", "extra", "hf_model")


def _names(registry: Any) -> tuple[str, ...]:
    return tuple(registry.names()) if hasattr(registry, "names") else tuple(registry)


def adv_estimators() -> tuple[str, ...]:
    from rlpost.algos import advantages

    return _names(advantages.ADV_ESTIMATORS)


def policy_losses() -> tuple[str, ...]:
    from rlpost.algos import losses

    return _names(losses.POLICY_LOSSES)


def loss_agg_modes() -> tuple[str, ...]:
    from rlpost.algos import losses

    return _names(losses.LOSS_AGG_MODES)


def kl_estimators() -> tuple[str, ...]:
    """Every KL estimator name, with and without the straight-through '+' suffix."""
    from rlpost.algos import kl

    return tuple(kl.kl_estimator_names())


def rollout_engines() -> tuple[str, ...]:
    from rlpost.rollout import engine_names

    return tuple(engine_names())


def reward_managers() -> tuple[str, ...]:
    from rlpost.reward.managers import REWARD_MANAGERS

    return _names(REWARD_MANAGERS)


def tool_call_formats() -> tuple[str, ...]:
    from rlpost.agent.tool_parser import TOOL_PARSERS

    return _names(TOOL_PARSERS)


def enums() -> dict[str, tuple[Any, ...]]:
    """Enumerated key -> its valid values (registries are read now, after user registrations)."""
    kl_names, agg = kl_estimators(), loss_agg_modes()
    return {
        "algorithm.adv_estimator": adv_estimators(),
        "algorithm.kl_penalty": kl_names,
        "algorithm.kl_ctrl.type": ("fixed", "adaptive"),
        "algorithm.pf_ppo.reweight_method": ("pow", "max_min", "max_random"),
        "algorithm.rollout_correction.rollout_is": (None, "token", "sequence"),
        "algorithm.rollout_correction.loss_type": ("ppo_clip", "reinforce"),
        f"{ARR}.actor.kl_loss_type": kl_names,
        f"{ARR}.actor.loss_agg_mode": agg,
        f"{ARR}.actor.router_replay.mode": ("disabled", "R2", "R3"),
        f"{ARR}.actor.policy_loss.loss_mode": policy_losses(),
        "critic.loss_agg_mode": agg,
        f"{ARR}.actor.strategy": STRATEGIES,
        f"{ARR}.ref.strategy": STRATEGIES,
        "critic.strategy": STRATEGIES,
        # the engine's own backend (verl's engine group): fsdp and fsdp2 both run FSDP2; fsdp_turbo is refused
        **{f"{group}.strategy": ("fsdp2", "fsdp", "fsdp_turbo")
           for group in (f"{ARR}.actor.fsdp_config", f"{ARR}.ref.fsdp_config", "critic.model.fsdp_config")},
        "reward_model.strategy": STRATEGIES,
        f"{ARR}.actor.optim.lr_scheduler": LR_SCHEDULERS,
        "critic.optim.lr_scheduler": LR_SCHEDULERS,
        f"{ARR}.actor.checkpoint.save_contents": CONTENTS,
        f"{ARR}.actor.checkpoint.load_contents": CONTENTS,
        "critic.checkpoint.save_contents": CONTENTS,
        "critic.checkpoint.load_contents": CONTENTS,
        f"{ARR}.model.fused_kernel_options.impl_backend": ("torch", "triton"),
        f"{ARR}.rollout.name": rollout_engines(),
        f"{ARR}.rollout.mode": ("sync", "async"),
        f"{ARR}.rollout.dtype": ("bfloat16", "float16", "float32"),
        f"{ARR}.rollout.load_format": (
            "dummy", "dummy_dtensor", "dummy_hf", "dtensor", "hf", "auto", "safetensors", "megatron", "dummy_megatron",
        ),
        f"{ARR}.rollout.multi_turn.tool_response_truncate_side": ("left", "middle", "right"),
        f"{ARR}.rollout.multi_turn.tokenization_sanity_check_mode": ("strict", "ignore_strippable", "disable"),
        f"{ARR}.rollout.multi_turn.format": tool_call_formats(),
        "data.truncation": ("error", "left", "right", "middle"),
        "reward_model.reward_manager": reward_managers(),
        "reward.reward_manager.source": ("register", "importlib"),
        "trainer.resume_mode": ("auto", "disable", "resume_path"),
        "trainer.logger": ("console", "file", "wandb", "tensorboard", "mlflow", "swanlab", "trackio", "vemlp_wandb"),
        "trainer.device": ("cuda", "cpu"),
        "trainer.use_legacy_worker_impl": ("auto", "enable", "disable"),
        "trainer.v1.trainer_mode": ("sync", "colocate_async", "separate_async"),
        "trainer.v1.sampler.max_off_policy_strategy": ("drop", "wait"),
        **{f"{group}.mixed_precision.param_dtype": (None, "bf16", "bfloat16", "fp16", "float16", "fp32", "float32")
           for group in (f"{ARR}.actor.fsdp_config", f"{ARR}.ref.fsdp_config", "critic.model.fsdp_config")},
        **{f"{group}.model_dtype": ("fp32", "float32", "bf16", "bfloat16")
           for group in (f"{ARR}.actor.fsdp_config", f"{ARR}.ref.fsdp_config", "critic.model.fsdp_config")},
    }
