"""rlpost: RL post-training for large language models (PPO, GRPO, RLOO, REINFORCE++, ReMax)."""

__version__ = "0.1.0"


def __getattr__(name: str):
    # `from rlpost import DataProto` as in verl, without importing torch for `import rlpost` alone.
    if name == "DataProto":
        from rlpost.protocol import DataProto

        return DataProto
    raise AttributeError(f"module 'rlpost' has no attribute {name!r}")
