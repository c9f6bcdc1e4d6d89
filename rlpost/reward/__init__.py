"""Rule-based rewards: built-in scorers, user reward functions, and the reward managers."""

from rlpost.reward.base import RewardFunctionError
from rlpost.reward.custom import RewardFnSpec, get_custom_reward_fn, load_function_from_file, reward_fn_spec
from rlpost.reward.managers import REWARD_MANAGERS, load_reward_manager
from rlpost.reward.preflight import check_reward_fn
from rlpost.reward.prime import PrimeRewardManager
from rlpost.reward.score import default_compute_score

__all__ = [
    "REWARD_MANAGERS",
    "PrimeRewardManager",
    "RewardFnSpec",
    "RewardFunctionError",
    "check_reward_fn",
    "default_compute_score",
    "get_custom_reward_fn",
    "load_function_from_file",
    "load_reward_manager",
    "reward_fn_spec",
]
