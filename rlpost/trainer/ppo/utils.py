"""verl import-path alias: `from rlpost.trainer.ppo.utils import Role, need_critic, need_reference_policy`."""

from rlpost.single_controller.ray.resource import ResourcePoolManager, Role
from rlpost.trainer.config.roles import need_critic, need_reference_policy, need_reward_model

__all__ = ["ResourcePoolManager", "Role", "need_critic", "need_reference_policy", "need_reward_model"]
