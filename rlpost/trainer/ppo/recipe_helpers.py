"""verl's DataProto-level helpers of `ray_trainer`, for recipes whose own `fit()` drives the step.

    from rlpost.trainer.ppo.ray_trainer import apply_kl_penalty, compute_advantage, compute_response_mask

`compute_advantage(batch, ...)` and `apply_kl_penalty(batch, ...)` take and return the batch, as verl's do; the
maths are the tensor functions of `rlpost.algos` (`core_algos.compute_advantage` / `core_algos.apply_kl_penalty`).

`WeightSync` is the trainer's `checkpoint_manager`: verl's loop calls `checkpoint_manager.update_weights()` after
each actor update and `sleep_replicas()` around checkpoints. The hybrid engine is also brought up to date by
the worker itself: an actor step that was never synced is synced on entering the next generation, as verl's
hybrid engine does (`ActorRolloutRefWorker.generate_sequences`); with split placement the driver sends an update
never sent before the next generation (`SplitRollouts`).
"""

from __future__ import annotations

from typing import Any

import torch

from rlpost import keys as K
from rlpost.algos import advantages as adv_algos
from rlpost.algos import kl as kl_algos
from rlpost.protocol import DataProto


def compute_response_mask(data: DataProto) -> torch.Tensor:
    """(B, R) attention mask of the response tokens (verl's helper for recipes)."""
    response_length = data.batch[K.RESPONSES].shape[1]
    return data.batch[K.ATTENTION_MASK][:, -response_length:]


def compute_advantage(data: DataProto, adv_estimator: Any, gamma: float = 1.0, lam: float = 1.0,
                      num_repeat: int = 1, norm_adv_by_std_in_grpo: bool = True, config: Any = None) -> DataProto:
    """verl's `compute_advantage(data, ...)`: writes `advantages` and `returns` (B, R) into `data`, returns it.

    Reads `token_level_rewards`, `response_mask` (made from the attention mask when absent), `uid` (group
    estimators), `values` (gae), `reward_baselines` (remax) and, when present, `old_log_probs`,
    `sum_pi_squared`, `rollout_is_weights`, `rollout_log_probs`. `num_repeat` is accepted for verl's call
    shape: the groups come from `uid`. `config` is the `algorithm` config, handed to the estimator.
    """
    if K.RESPONSE_MASK not in data.batch:
        data.batch[K.RESPONSE_MASK] = compute_response_mask(data)
    get = data.batch.get
    advantages, returns = adv_algos.compute_advantage(
        data.batch[K.TOKEN_LEVEL_REWARDS], data.batch[K.RESPONSE_MASK], adv_estimator,
        values=get(K.VALUES), index=data.non_tensor_batch.get(K.UID), reward_baselines=get(K.REWARD_BASELINES),
        gamma=gamma, lam=lam, norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo, config=config,
        non_tensor_batch=data.non_tensor_batch, old_log_probs=get(K.OLD_LOG_PROBS),
        sum_pi_squared=get(K.SUM_PI_SQUARED), rollout_is_weights=get(K.ROLLOUT_IS_WEIGHTS),
        rollout_log_probs=get(K.ROLLOUT_LOG_PROBS))
    data.batch[K.ADVANTAGES], data.batch[K.RETURNS] = advantages, returns
    return data


def apply_kl_penalty(data: DataProto, kl_ctrl: Any, kl_penalty: str = "kl") -> tuple[DataProto, dict[str, float]]:
    """verl's `apply_kl_penalty(data, kl_ctrl, kl_penalty)`: `token_level_rewards` = scores - beta * KL (B, R)
    from `token_level_scores`, `old_log_probs`, `ref_log_prob`, `response_mask`; updates `kl_ctrl`.

    Returns:
        (data, {"actor/reward_kl_penalty", "actor/reward_kl_penalty_coeff"}).
    """
    rewards, metrics = kl_algos.apply_kl_penalty(
        data.batch[K.TOKEN_LEVEL_SCORES], data.batch[K.OLD_LOG_PROBS], data.batch[K.REF_LOG_PROB],
        data.batch[K.RESPONSE_MASK], kl_ctrl, kl_penalty)
    data.batch[K.TOKEN_LEVEL_REWARDS] = rewards
    return data, metrics


class WeightSync:
    """verl's `checkpoint_manager` of the trainer: brings the rollout engines up to the actor's weights.

    Args:
        rollouts: the trainer's rollouts (`rlpost.trainer.ppo.rollout_driver`): hybrid (the actor's workers
            sync inside `update_actor`, or at the next generation) or split (weights sent to the rollout pool).
    """

    def __init__(self, rollouts: Any) -> None:
        self.rollouts = rollouts
        self.metrics: dict[str, float] = {}  # the last update's (split placement: timing_s/update_weights)

    def update_weights(self) -> None:
        """After an actor update: a new policy version; split placement sends the weights now."""
        self.metrics = {}
        self.rollouts.sync_weights(self.metrics)

    def sleep_replicas(self) -> None:
        """Release the engines' memory (verl: before a checkpoint). rlpost's engines already sleep between
        generations (`rollout.free_cache_engine`), so there is nothing left to release."""
