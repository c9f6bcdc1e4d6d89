"""rlpost: RL post-training for large language models (PPO, GRPO, RLOO, REINFORCE++, ReMax)."""

__version__ = "0.1.0"
