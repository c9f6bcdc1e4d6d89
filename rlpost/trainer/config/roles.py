"""Which worker roles a config creates (works on the DictConfig or on the typed config)."""

from typing import Any

from rlpost.reward.judge import generative_judge
from rlpost.trainer.config.errors import ConfigError

__all__ = ["generative_judge", "need_critic", "need_reference_policy", "need_reward_model"]


def need_critic(cfg: Any) -> bool:
    """True when a critic is created: the estimator needs one (gae) or `critic.enable=true`.

    Raises:
        ConfigError: `critic.enable=false` with the gae estimator, which needs values.
    """
    enable = cfg.critic.enable
    from rlpost.algos.advantages import estimator_needs

    gae = estimator_needs(cfg.algorithm.adv_estimator).critic
    if enable is False and gae:
        raise ConfigError(
            f"critic.enable=false with algorithm.adv_estimator={cfg.algorithm.adv_estimator}: it needs the critic's "
            "values; "
            "use critic.enable=null (or true), or algorithm.adv_estimator=grpo with actor_rollout_ref.rollout.n>1."
        )
    return bool(enable) or gae


def need_reference_policy(cfg: Any) -> bool:
    """True when a reference policy is created: `actor.use_kl_loss` or `algorithm.use_kl_in_reward`."""
    return bool(cfg.actor_rollout_ref.actor.use_kl_loss or cfg.algorithm.use_kl_in_reward)


def need_reward_model(cfg: Any) -> bool:
    """True when a (discriminative) reward-model worker is created: `reward_model.enable` without a judge."""
    return bool(cfg.reward_model.enable) and not generative_judge(cfg)



