"""The PPO-family training loop, run by the single controller (the driver process).

`RayPPOTrainer.fit()` reads top to bottom: for each batch of prompts it runs the phases of one step, each
timed under the name it is logged as (`timing_s/<phase>`):

    gen -> reward -> old_log_prob -> ref -> values -> adv -> update_critic -> update_actor
        (update_actor also syncs the new weights into the rollout engine: timing_s/update_weights)
    -> validation every `test_freq` -> checkpoint every `save_freq` -> metrics to every logger.

Workers hold the models; this file only moves `DataProto` batches between worker groups and does the
cheap per-token maths (advantages, KL-in-reward) on the driver.
"""

from __future__ import annotations

import logging
import time
import uuid
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf, open_dict

from rlpost import keys as K
from rlpost.protocol import DataProto
from rlpost.trainer.ppo import core_algos
from rlpost.trainer.ppo.checkpointing import TrainerCheckpointer
from rlpost.trainer.ppo.metric_utils import (
    compute_data_metrics,
    compute_throughout_metrics,
    compute_timing_metrics,
)
from rlpost.trainer.ppo.roles import WorkerGroups
from rlpost.trainer.ppo.validation import Validator, dump_generations, generation_inputs

logger = logging.getLogger(__name__)


@contextmanager
def _timer(name: str, timing: dict[str, float]):
    """Add the wall time of the block to `timing[name]` (seconds)."""
    start = time.perf_counter()
    yield
    timing[name] = timing.get(name, 0.0) + time.perf_counter() - start


class RayPPOTrainer:
    """Drives PPO / GRPO / RLOO / REINFORCE++ / ReMax training over Ray worker groups.

    Args:
        config: the validated, composed `ppo_trainer` config.
        tokenizer: the policy tokenizer (eos/pad ids for generation, decoding for dumps).
        workers: the built worker groups (`WorkerGroups`): actor_rollout (+ref), optional critic and reward model.
        reward_fn / val_reward_fn: reward managers, `fn(data, return_dict=True)`.
        train_dataloader / val_dataloader: loaders yielding collated dicts of prompts.
    """

    def __init__(self, config: DictConfig, tokenizer, workers: WorkerGroups, reward_fn, val_reward_fn,
                 train_dataloader, val_dataloader):
        self.config = config
        self.tokenizer = tokenizer
        self.workers = workers
        self.reward_fn = reward_fn
        self.train_dataloader = train_dataloader
        self.algo = config.algorithm
        self.use_critic = workers.critic is not None
        self.use_ref = workers.has_ref
        self.kl_ctrl = core_algos.get_kl_controller(self.algo.kl_ctrl) if self.algo.use_kl_in_reward else None
        self.total_training_steps = total_training_steps(config, len(train_dataloader))
        self.validator = Validator(config, tokenizer, workers.actor_rollout, val_reward_fn, val_dataloader)
        self.checkpointer = TrainerCheckpointer(config, workers, train_dataloader)
        self.global_steps = 0

    # ------------------------------------------------------------------------------------------------
    def fit(self, tracker) -> dict[str, float]:
        """Train until `total_training_steps`; returns the last step's metrics."""
        trainer_cfg = self.config.trainer
        self.global_steps = self.checkpointer.maybe_resume()
        if self.global_steps >= self.total_training_steps:
            print(f"[rlpost] training already complete: checkpoint at step {self.global_steps} of "
                  f"{self.total_training_steps}; nothing to do.")
            return {}
        if self.validator.enabled and (trainer_cfg.val_before_train or trainer_cfg.val_only):
            val_metrics = self.validator.validate(self.global_steps, tracker)
            tracker.log(val_metrics, step=self.global_steps)
            if trainer_cfg.val_only:
                return val_metrics
        from rlpost.utils.tracking import StepProgress

        progress = StepProgress(self.total_training_steps, initial_step=self.global_steps)
        metrics: dict[str, float] = {}
        for epoch in range(self.checkpointer.start_epoch, trainer_cfg.total_epochs):
            for batch_dict in self.train_dataloader:
                self.global_steps += 1
                is_last = self.global_steps >= self.total_training_steps
                metrics = self.train_step(DataProto.from_single_dict(batch_dict))
                metrics["training/epoch"] = epoch
                if self._due(trainer_cfg.test_freq, is_last) and self.validator.enabled:
                    metrics.update(self.validator.validate(self.global_steps, tracker))
                if self._due(trainer_cfg.save_freq, is_last):
                    with _timer("save_checkpoint", timing := {}):
                        self.checkpointer.save(self.global_steps, epoch)
                    metrics["timing_s/save_checkpoint"] = timing["save_checkpoint"]
                tracker.log(metrics, step=self.global_steps)
                progress.update(1, metrics)
                if is_last:
                    progress.close()
                    return metrics
        progress.close()
        return metrics

    def _due(self, freq: int, is_last: bool) -> bool:
        return freq is not None and freq > 0 and (is_last or self.global_steps % freq == 0)

    # ------------------------------------------------------------------------------------------------
    def train_step(self, batch: DataProto) -> dict[str, Any]:
        """One PPO step over a batch of prompts; returns every metric of the step."""
        timing: dict[str, float] = {}
        metrics: dict[str, Any] = {}
        with _timer("step", timing):
            batch = self._generate(batch, timing)
            if self.config.trainer.balance_batch:
                self._balance_batch(batch, metrics)
            with _timer("reward", timing):
                reward_extra = self._compute_reward(batch)
            with _timer("old_log_prob", timing):
                self._compute_old_log_prob(batch, metrics)
            if self.use_ref:
                with _timer("ref", timing):
                    batch = batch.union(self.workers.actor_rollout.compute_ref_log_prob(batch))
            if self.use_critic:
                with _timer("values", timing):
                    batch = batch.union(self.workers.critic.compute_values(batch))
            with _timer("adv", timing):
                self._compute_advantage(batch, metrics)
            if self.use_critic:
                with _timer("update_critic", timing):
                    out = self.workers.critic.update_critic(batch)
                metrics.update(_reduce(out.meta_info[K.META_METRICS]))
            if self.config.trainer.critic_warmup <= self.global_steps:
                with _timer("update_actor", timing):
                    out = self.workers.actor_rollout.update_actor(batch)
                metrics.update(_reduce(out.meta_info[K.META_METRICS]))
        timing.update({k.removeprefix("timing_s/"): metrics.pop(k) for k in list(metrics) if k.startswith("timing_s/")})
        self._dump_rollouts(batch, reward_extra)
        n_devices = self.config.trainer.n_gpus_per_node * self.config.trainer.nnodes
        metrics.update(compute_data_metrics(batch, use_critic=self.use_critic))
        metrics.update(compute_timing_metrics(batch, timing))
        metrics.update(compute_throughout_metrics(batch, timing, n_devices))
        metrics["training/global_step"] = self.global_steps
        return metrics

    # --- phases ------------------------------------------------------------------------------------
    def _generate(self, batch: DataProto, timing: dict[str, float]) -> DataProto:
        """Give each prompt a uid, repeat it `rollout.n` times and generate one response per row."""
        rollout_cfg = self.config.actor_rollout_ref.rollout
        batch.non_tensor_batch[K.UID] = np.array([str(uuid.uuid4()) for _ in range(len(batch))], dtype=object)
        batch = batch.repeat(rollout_cfg.n, interleave=True)
        gen_batch = self._gen_inputs(batch)
        with _timer("gen", timing):
            out = self.workers.actor_rollout.generate_sequences(gen_batch)
        timing_out = out.meta_info.pop(K.META_METRICS, {}) or {}
        if self.algo.adv_estimator == "remax":
            with _timer("gen_max", timing):
                greedy = self._gen_inputs(batch)
                greedy.meta_info[K.META_DO_SAMPLE] = False
                greedy_out = self.workers.actor_rollout.generate_sequences(greedy)
                greedy_out.meta_info.pop(K.META_METRICS, None)
                batch.batch[K.REWARD_BASELINES] = self._score_only(batch, greedy_out)
        for k in (K.INPUT_IDS, K.ATTENTION_MASK, K.POSITION_IDS):
            batch.batch.pop(k)
        batch = batch.union(out)
        batch.meta_info.update({k: v for k, v in timing_out.items() if not k.startswith("timing_s/")})
        return batch

    def _gen_inputs(self, batch: DataProto) -> DataProto:
        return generation_inputs(batch, self.tokenizer, validate=False, step=self.global_steps,
                                 do_sample=self.config.actor_rollout_ref.rollout.do_sample)

    def _score_only(self, batch: DataProto, gen_out: DataProto) -> torch.Tensor:
        """ReMax baseline: the sequence score of the greedy response to the same prompt, shape (B,)."""
        scored = batch.select(non_tensor_batch_keys=list(batch.non_tensor_batch.keys()))
        for k in (K.INPUT_IDS, K.ATTENTION_MASK, K.POSITION_IDS):
            scored.batch.pop(k, None)
        scored = scored.union(gen_out)
        result = self.reward_fn(scored, return_dict=True)
        return result["reward_tensor"].sum(dim=-1)

    def _balance_batch(self, batch: DataProto, metrics: dict[str, Any]) -> None:
        """Reorder rows so every data-parallel rank gets a similar number of tokens."""
        from rlpost.utils.seqlen_balancing import balanced_partition_order

        world = self.workers.actor_rollout.world_size
        seqlens = batch.batch[K.ATTENTION_MASK].sum(dim=-1)
        order, spread = balanced_partition_order(seqlens.tolist(), world)
        batch.reorder(torch.tensor(order))
        metrics["training/balance_token_spread"] = spread

    def _compute_reward(self, batch: DataProto) -> dict[str, list]:
        if self.workers.reward_model is not None:
            batch.union(self.workers.reward_model.compute_rm_score(batch))
        result = self.reward_fn(batch, return_dict=True)
        batch.batch[K.TOKEN_LEVEL_SCORES] = result["reward_tensor"]
        extra = result.get("reward_extra_info", {}) or {}
        for name, values in extra.items():
            batch.non_tensor_batch[name] = np.asarray(values, dtype=object)
        return extra

    def _compute_old_log_prob(self, batch: DataProto, metrics: dict[str, Any]) -> None:
        out = self.workers.actor_rollout.compute_log_prob(batch)
        entropys = out.batch.pop(K.ENTROPYS, None)
        if entropys is not None:
            metrics["actor/entropy"] = core_algos.agg_loss(
                entropys, batch.batch[K.RESPONSE_MASK], self.config.actor_rollout_ref.actor.loss_agg_mode
            ).item()
        batch.union(out)
        if K.ROLLOUT_LOG_PROBS in batch.batch:
            from rlpost.rollout.drift import rollout_probs_diff

            drift = rollout_probs_diff(batch.batch[K.ROLLOUT_LOG_PROBS], batch.batch[K.OLD_LOG_PROBS],
                                       batch.batch[K.RESPONSE_MASK])
            metrics.update(drift)
            if drift["training/rollout_probs_diff_max"] > self.config.trainer.get("rollout_drift_warn", 0.5):
                logger.warning("rollout and actor probabilities differ by up to %.3f at step %d: check "
                               "dtype / sampling settings", drift["training/rollout_probs_diff_max"],
                               self.global_steps)

    def _compute_advantage(self, batch: DataProto, metrics: dict[str, Any]) -> None:
        mask = batch.batch[K.RESPONSE_MASK]
        scores = batch.batch[K.TOKEN_LEVEL_SCORES]
        if self.kl_ctrl is not None:
            rewards, kl_metrics = core_algos.apply_kl_penalty(
                scores, batch.batch[K.OLD_LOG_PROBS], batch.batch[K.REF_LOG_PROB], mask, self.kl_ctrl,
                self.algo.kl_penalty)
            metrics.update(kl_metrics)
        else:
            rewards = scores
        batch.batch[K.TOKEN_LEVEL_REWARDS] = rewards
        adv, ret = core_algos.compute_advantage(
            rewards, mask, self.algo.adv_estimator,
            values=batch.batch.get(K.VALUES), index=batch.non_tensor_batch[K.UID],
            reward_baselines=batch.batch.get(K.REWARD_BASELINES), gamma=self.algo.gamma, lam=self.algo.lam,
            norm_adv_by_std_in_grpo=self.algo.norm_adv_by_std_in_grpo, config=self.algo,
        )
        batch.batch[K.ADVANTAGES], batch.batch[K.RETURNS] = adv, ret
        if self.algo.use_pf_ppo:
            idx = core_algos.pf_ppo_sample_indices(
                scores.sum(-1), self.algo.pf_ppo.reweight_method, self.algo.pf_ppo.weight_pow)
            batch.reorder(idx)

    def _dump_rollouts(self, batch: DataProto, reward_extra: dict[str, list]) -> None:
        out_dir = self.config.trainer.rollout_data_dir
        if out_dir:
            dump_generations(self.tokenizer, batch, out_dir, self.global_steps, reward_extra)


def _reduce(metrics: dict[str, Any]) -> dict[str, float]:
    """Mean of every list-valued metric gathered from several ranks or micro-batches."""
    return {k: float(np.mean(v)) if isinstance(v, (list, tuple, np.ndarray)) else v for k, v in metrics.items()}


def total_training_steps(config: DictConfig, batches_per_epoch: int) -> int:
    """`trainer.total_training_steps` when set, else epochs x batches per epoch."""
    steps = batches_per_epoch * config.trainer.total_epochs
    if config.trainer.total_training_steps is not None:
        steps = int(config.trainer.total_training_steps)
    return steps


def inject_total_training_steps(config: DictConfig, steps: int) -> None:
    """Workers' LR schedulers need the number of optimiser phases; the trainer knows it first."""
    with open_dict(config):
        config.actor_rollout_ref.actor.optim.total_training_steps = steps
        if OmegaConf.select(config, "critic.optim") is not None:
            config.critic.optim.total_training_steps = steps
