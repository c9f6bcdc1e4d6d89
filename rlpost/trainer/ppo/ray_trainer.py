"""The PPO-family training loop, run by the single controller (the driver, or a Ray task such as `TaskRunner`).

Built the verl way:

    trainer = RayPPOTrainer(config, tokenizer, role_worker_mapping, resource_pool_manager,
                            reward_fn=reward_fn, val_reward_fn=val_reward_fn)
    trainer.init_workers()
    trainer.fit()

`RayPPOTrainer.train_step()` reads top to bottom: for each batch of prompts it runs the phases of one step,
each timed under the name it is logged as (`timing_s/<phase>`):

    gen -> reward -> old_log_prob (-> rollout_correction) -> ref -> values -> adv -> update_critic -> update_actor
        (the actor worker then syncs the new weights into the rollout engine, timed apart as
         timing_s/update_weights; inside gen, the slowest rollout rank's own timing_s/gen_wake, gen_engine,
         gen_sleep)
    -> validation every `test_freq` -> checkpoint every `save_freq` -> metrics to every logger.

With `algorithm.filter_groups.enable` (DAPO dynamic sampling, `features/dynamic_sampling.py`), gen + reward
repeat over further batches of prompts until enough groups with varied outcomes are kept. Workers hold the models;
this file only moves `DataProto` batches between worker groups and does the cheap per-token maths on the driver.
"""

from __future__ import annotations

import dataclasses

import logging
import uuid
from typing import Any, Iterator

import numpy as np
import torch

from rlpost import keys as K
from rlpost.algos import moe_load
from rlpost.algos.rollout_correction import compute_rollout_correction
from rlpost.protocol import DataProto
from rlpost.reward.judge import judge_metrics
from rlpost.reward.score.code import format_slowest, sandbox_metrics, slowest_samples
from rlpost.single_controller.ray import RayWorkerGroup, ResourcePoolManager, Role
from rlpost.trainer.ppo import core_algos
from rlpost.trainer.ppo.checkpointing import TrainerCheckpointer, already_complete
from rlpost.utils.profiler import simple_timer as _timer
from rlpost.workers.judge_server import start_judge
from rlpost.trainer.ppo.core_algos import AdvantageEstimator
from rlpost.trainer.ppo.dynamic_sampling import DataExhausted
from rlpost.trainer.ppo.features import active_features
from rlpost.trainer.ppo.preflight import estimate_metrics
from rlpost.trainer.ppo.profiling import ProfileSchedule
from rlpost.trainer.ppo.recipe_helpers import WeightSync, apply_kl_penalty, compute_advantage, compute_response_mask
from rlpost.trainer.ppo.reward_job import RewardJob
from rlpost.trainer.ppo.metric_utils import (
    add_gen_parts,
    compute_data_metrics,
    compute_throughout_metrics,
    compute_timing_metrics,
    reduce_metrics,
)
from rlpost.trainer.ppo.roles import WorkerGroups, build_worker_groups, plan_roles
from rlpost.trainer.ppo.rollout_driver import PREPARED, build_rollouts
from rlpost.trainer.ppo.validation import Validator, chat_template_kwargs, dump_generations, generation_inputs

__all__ = ["AdvantageEstimator", "RayPPOTrainer", "ResourcePoolManager", "Role", "apply_kl_penalty",
           "compute_advantage", "compute_response_mask"]

logger = logging.getLogger(__name__)


class RayPPOTrainer:
    """Drives PPO / GRPO / RLOO / REINFORCE++ / ReMax / DAPO training over Ray worker groups.

    Args:
        config: the typed `ppo_trainer` config, or the composed DictConfig (validated here, once); the
            trainer, its phases and its workers all read the typed one, `self.config`.
        tokenizer: the policy tokenizer (eos/pad ids for generation, decoding for dumps).
        role_worker_mapping: {Role: worker class or `ray.remote(worker class)`}; needs Role.ActorRollout
            (or Role.ActorRolloutRef), plus Role.RefPolicy / Role.Critic / Role.RewardModel when the
            config uses a reference policy / critic / reward model.
        resource_pool_manager: {pool name: processes per node} and {Role: pool name}.
        ray_worker_group_cls: worker group class (`RayWorkerGroup` or a subclass).
        processor: multimodal processor handed to the datasets built here.
        reward_fn / val_reward_fn: reward managers, `fn(data, return_dict=True)`.
        train_dataset / val_dataset / collate_fn / train_sampler: built from `data.*` when None.
        device_name: `cuda` or `cpu` (default `trainer.device`); CPU gives CPU-only pools.
    """

    def __init__(self, config: Any, tokenizer, role_worker_mapping: dict[Role, Any],
                 resource_pool_manager: ResourcePoolManager, ray_worker_group_cls: type = RayWorkerGroup,
                 processor=None, reward_fn=None, val_reward_fn=None, train_dataset=None, val_dataset=None,
                 collate_fn=None, train_sampler=None, device_name: str | None = None):
        from rlpost.trainer.config import as_typed

        config = as_typed(config)  # frozen, validated; reads like verl's DictConfig (`.get`, `[]`, `in`)
        self.config, self.tokenizer, self.processor = config, tokenizer, processor
        self.reward_fn, self.val_reward_fn = reward_fn, val_reward_fn
        self.role_worker_mapping = role_worker_mapping
        self.resource_pool_manager = resource_pool_manager
        self.ray_worker_group_cls = ray_worker_group_cls
        self.device_name = device_name or config.trainer.device
        self.hybrid_engine = config.actor_rollout_ref.hybrid_engine
        self.plan = plan_roles(config, role_worker_mapping, resource_pool_manager)
        self.use_critic, self.use_rm = self.plan.use_critic, self.plan.use_rm
        self.use_reference_policy, self.ref_in_actor = self.plan.use_reference_policy, self.plan.ref_in_actor
        self.algo = config.algorithm
        self.kl_ctrl_in_reward = (core_algos.get_kl_controller(self.algo.kl_ctrl) if self.algo.use_kl_in_reward
                                  else None)
        rc = self.algo.rollout_correction  # bypass mode corrects inside the actor's loss instead
        self.use_rollout_correction = bool(rc.rollout_is or rc.rollout_rs or rc.rollout_token_veto_threshold is not None
                                           ) and not rc.bypass_mode
        self.workers: WorkerGroups | None = None
        self.profiler, self.memory_estimate = ProfileSchedule(self.config, {}), {}  # set in init_workers
        self.global_steps, self.epoch, self.tracker = 0, 0, None
        self.features = active_features(self)  # what the estimator and options add to the step
        self._create_dataloader(train_dataset, val_dataset, collate_fn, train_sampler)

    def _create_dataloader(self, train_dataset, val_dataset, collate_fn, train_sampler) -> None:
        """Loaders (built from `data.*` where not given), then the step count the LR schedules need."""
        from rlpost.trainer.ppo.dataloaders import create_dataloaders, total_training_steps

        self.train_dataloader, self.val_dataloader = create_dataloaders(
            self.config, self.tokenizer, self.processor, train_dataset, val_dataset, collate_fn, train_sampler)
        self.train_dataset = self.train_dataloader.dataset
        self.val_dataset = self.val_dataloader.dataset if self.val_dataloader is not None else None
        self.total_training_steps = total_training_steps(self.config, len(self.train_dataloader))

    def init_workers(self) -> None:
        """Create the resource pools and worker groups and initialise every role's models."""
        if self.resource_pool_manager.use_gpu is None:
            self.resource_pool_manager.use_gpu = self.device_name == "cuda"
        self.judge_pool = start_judge(self.config, self.reward_fn, self.val_reward_fn)  # a generative RM's pool
        self.workers = build_worker_groups(self.config, self.plan, self.role_worker_mapping,
                                           self.resource_pool_manager, self.ray_worker_group_cls,
                                           self.total_training_steps)
        self.rollouts = build_rollouts(self.config, self.workers, self._prepare, self._gen_inputs)
        self.checkpoint_manager = WeightSync(self.rollouts)  # verl's name: update_weights() after an update
        self.validator = Validator(self.config, self.tokenizer, self.rollouts, self.val_reward_fn,
                                   self.val_dataloader)
        self.checkpointer = TrainerCheckpointer(self.config, self.workers, self.train_dataloader, self.rollouts,
                                                self.features)
        self.profiler = ProfileSchedule(self.config, {
            "actor": self.actor_rollout_wg, "rollout": self.actor_rollout_wg, "ref": self.ref_policy_wg,
            "critic": self.critic_wg, "reward_model": self.rm_wg})
        self.memory_estimate = estimate_metrics(self.config)  # logged with the first step's measured peaks

    # verl's names of the worker groups
    @property
    def actor_rollout_wg(self):
        return self.workers.actor_rollout

    @property
    def critic_wg(self):
        return self.workers.critic

    @property
    def rm_wg(self):
        return self.workers.reward_model

    @property
    def ref_policy_wg(self):
        return self.workers.ref_policy

    # ------------------------------------------------------------------------------------------------
    def fit(self) -> dict[str, float]:
        """Train until `total_training_steps`, logging to `trainer.logger`; returns the last step's metrics."""
        from rlpost.utils.tracking import Tracking

        if self.workers is None:
            raise RuntimeError("call trainer.init_workers() before trainer.fit()")
        self.tracker = Tracking(
            project_name=self.config.trainer.project_name, experiment_name=self.config.trainer.experiment_name,
            default_backend=list(self.config.trainer.logger), config=self.config.to_dict(),
            log_dir=self.config.trainer.default_local_dir)
        try:
            return self._train_loop()
        finally:
            self.tracker.finish()

    def _train_loop(self) -> dict[str, float]:
        from rlpost.trainer.ppo.nonfinite import NonFiniteGuard
        from rlpost.utils.tracking import StepProgress

        trainer_cfg = self.config.trainer
        self.global_steps = self._load_checkpoint()
        self.tracker.resume_at(self.global_steps)
        if self.global_steps:
            self.rollouts.set_version(self.global_steps)
        if self.global_steps >= self.total_training_steps:
            print(already_complete(self.global_steps, self.total_training_steps))
            return {}
        if self.validator.enabled and (trainer_cfg.val_before_train or trainer_cfg.val_only):
            val_metrics = self._validate()
            self.tracker.log(val_metrics, step=self.global_steps)
            if trainer_cfg.val_only:
                return val_metrics
        progress = StepProgress(self.total_training_steps, initial_step=self.global_steps)
        guard = NonFiniteGuard(trainer_cfg.max_nonfinite_steps)
        metrics: dict[str, float] = {}
        batches = self.rollouts.batches(self._train_batches())
        for batch in batches:
            self.global_steps += 1
            is_last = self.global_steps >= self.total_training_steps
            try:
                with self.profiler.step(self.global_steps, is_last):
                    metrics = self.train_step(batch, batches)
            except DataExhausted as err:
                self.global_steps -= 1  # the step never ran
                print(f"[rlpost] stopping at step {self.global_steps}: {err}")
                break
            metrics["training/epoch"] = self.epoch
            metrics.update(self.memory_estimate)
            self.memory_estimate = {}
            nonfinite = guard.observe(self.global_steps, metrics)
            if self._due(trainer_cfg.test_freq, is_last) and self.validator.enabled:
                metrics.update(self._validate())
            if self._due(trainer_cfg.save_freq, is_last) and not nonfinite:
                with _timer("save_checkpoint", timing := {}):
                    self._save_checkpoint()
                metrics["timing_s/save_checkpoint"] = timing["save_checkpoint"]
            self.tracker.log(metrics, step=self.global_steps)
            progress.update(1, metrics)
            if is_last:
                break
        progress.close()
        return metrics

    def _train_batches(self) -> Iterator[dict]:
        """Batches of prompts from the resume point to the end of the last epoch, through each step feature's
        `batches` (e.g. CoDaPO's focused step after each batch); keeps `self.epoch`."""
        self.epoch = self.checkpointer.start_epoch
        batches = self._loader_batches()
        for feature in self.features:
            batches = feature.batches(batches)
        return batches

    def _loader_batches(self) -> Iterator[dict]:
        for epoch in range(self.checkpointer.start_epoch, self.config.trainer.total_epochs):
            self.epoch = epoch
            yield from self.train_dataloader

    def _due(self, freq: int, is_last: bool) -> bool:
        return freq is not None and freq > 0 and (is_last or self.global_steps % freq == 0)

    # verl's hooks, overridable by recipes
    def _validate(self) -> dict[str, float]:
        return self.validator.validate(self.global_steps, self.tracker)

    def _save_checkpoint(self) -> str:
        return self.checkpointer.save(self.global_steps, self.epoch)

    def _load_checkpoint(self) -> int:
        """Resume per `trainer.resume_mode`; sets `global_steps` to the checkpoint's step (0 when starting fresh,
        as verl's recipes expect) and returns it."""
        self.global_steps = self.checkpointer.maybe_resume()
        return self.global_steps

    # ------------------------------------------------------------------------------------------------
    def train_step(self, batch: DataProto, more_batches: Iterator[dict] | None = None) -> dict[str, Any]:
        """One PPO step over a batch of prompts; returns every metric of the step.

        `more_batches` supplies further batches of prompts to dynamic sampling (algorithm.filter_groups).
        """
        timing: dict[str, float] = {}
        metrics: dict[str, Any] = {}
        with _timer("step", timing):
            batch, reward_keys = self._generate_step(batch, more_batches, timing, metrics)
            if self.config.trainer.balance_batch:
                self._balance_batch(batch, metrics)
            reward = None  # a `RewardJob` when the reward runs after balancing (in the background when async)
            if reward_keys is None:
                with _timer("reward", timing):
                    reward = self._start_reward(batch, self.config.reward_model.launch_reward_fn_async)
            with _timer("old_log_prob", timing):
                self._compute_old_log_prob(batch, metrics)
            if self.use_rollout_correction:
                with _timer("rollout_correction", timing):
                    self._apply_rollout_correction(batch, metrics)
            if self.use_reference_policy:
                with _timer("ref", timing):
                    batch = batch.union(self.ref_policy_wg.compute_ref_log_prob(batch))
            if self.use_critic:
                with _timer("values", timing):
                    batch = batch.union(self.critic_wg.compute_values(batch))
            if reward is not None:
                with _timer("reward_wait", timing):
                    reward_keys = self._store_reward(batch, reward)
            metrics.update(_reward_metrics(batch, self.global_steps))
            with _timer("adv", timing):
                self._compute_advantage(batch, metrics)
            if self.use_critic:
                with _timer("update_critic", timing):
                    out = self.critic_wg.update_critic(batch)
                metrics.update(reduce_metrics(out.meta_info[K.META_METRICS]))
            if self.config.trainer.critic_warmup <= self.global_steps:
                with _timer("update_actor", timing):
                    out = self.actor_rollout_wg.update_actor(batch)
                    self.rollouts.sync_weights(metrics)
                metrics.update(reduce_metrics(out.meta_info[K.META_METRICS]))
        timing.update({k.removeprefix("timing_s/"): metrics.pop(k) for k in list(metrics) if k.startswith("timing_s/")})
        self._dump_rollouts(batch, reward_keys)
        n_devices = self.config.trainer.n_gpus_per_node * self.config.trainer.nnodes
        metrics.update(compute_data_metrics(batch, use_critic=self.use_critic))
        metrics.update(compute_timing_metrics(batch, timing))
        metrics.update(compute_throughout_metrics(batch, timing, n_devices))
        metrics.update(self.rollouts.metrics(self.global_steps))
        metrics["training/global_step"] = self.global_steps
        return metrics

    # --- phases ------------------------------------------------------------------------------------
    def _generate_step(self, batch: DataProto, more_batches: Iterator[dict] | None, timing: dict[str, float],
                       metrics: dict[str, Any]) -> tuple[DataProto, list[str] | None]:
        """gen: the responses joined to their prompts. A feature that generates and scores the batch itself
        (DAPO's dynamic sampling) runs instead and also returns the reward's extra keys; else they are None."""
        for feature in self.features:
            if feature.generates_scored:
                return feature.generate_scored(batch, more_batches, timing, metrics)
        batch = self._generate(batch, timing)
        for feature in self.features:  # e.g. over-sampling's cut of the groups that did not finish
            batch = feature.after_rollout(batch, metrics)
        return batch, None

    def _generate_and_score(self, batch: DataProto, timing: dict[str, float]) -> tuple[DataProto, list[str]]:
        """gen + reward: the scored rollouts and the names of the reward's extra per-row fields."""
        batch = self._generate(batch, timing)
        with _timer("reward", timing):
            keys = self._store_reward(batch, self._start_reward(batch, run_async=False))
        return batch, keys

    def _prepare(self, batch: DataProto) -> DataProto:
        """Give each prompt a uid and repeat it `rollout.n` times (once: the rollouts may have done it)."""
        if batch.meta_info.get(PREPARED):
            return batch
        batch.non_tensor_batch[K.UID] = np.array([str(uuid.uuid4()) for _ in range(len(batch))], dtype=object)
        for feature in self.features:
            feature.after_prepare(batch)
        batch = batch.repeat(self.config.actor_rollout_ref.rollout.n, interleave=True)
        batch.meta_info[PREPARED] = True
        return batch

    def _generate(self, batch: DataProto, timing: dict[str, float]) -> DataProto:
        """One response per row of the prepared batch (generated now, or ahead by `self.rollouts`)."""
        batch = self._prepare(batch)
        with _timer("gen", timing):
            out = self.rollouts.generate(batch)
        timing_out = out.meta_info.pop(K.META_METRICS, {}) or {}
        add_gen_parts(timing, timing_out)
        for feature in self.features:  # the prompts, before the responses join them (e.g. ReMax's greedy baseline)
            feature.after_generate(batch, timing)
        for k in (K.INPUT_IDS, K.ATTENTION_MASK, K.POSITION_IDS):
            batch.batch.pop(k)
        batch = batch.union(out)
        batch.meta_info.update({k: v for k, v in timing_out.items() if not k.startswith("timing_s/")})
        return batch

    def _get_gen_batch(self, batch: DataProto) -> DataProto:
        """verl's recipe helper: pop the generation inputs (prompt tensors, the fields agent loops read) off a
        batch of prompts; the rollout output then unions back into `batch` (reward fields stay there)."""
        gen = self._gen_inputs(batch)
        batch.pop(batch_keys=list(gen.batch.keys()),
                  non_tensor_batch_keys=[k for k in gen.non_tensor_batch if k != K.UID])
        return gen

    def _gen_inputs(self, batch: DataProto, step: int | None = None) -> DataProto:
        return generation_inputs(batch, self.tokenizer, validate=False,
                                 step=self.global_steps if step is None else step,
                                 do_sample=self.config.actor_rollout_ref.rollout.do_sample,
                                 chat_template_kwargs=chat_template_kwargs(self.config))

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

        world = self.actor_rollout_wg.world_size
        seqlens = batch.batch[K.ATTENTION_MASK].sum(dim=-1)
        order, spread = balanced_partition_order(seqlens.tolist(), world)
        batch.reorder(torch.tensor(order))
        metrics["training/balance_token_spread"] = spread

    def _start_reward(self, batch: DataProto, run_async: bool) -> RewardJob:
        """Reward-model scores (`rm_scores`, now) and the reward function's job on them (`run_async`: in
        the background, `reward_model.launch_reward_fn_async`)."""
        if self.workers.reward_model is not None:
            batch.union(self.workers.reward_model.compute_rm_score(batch))
        return RewardJob(self.reward_fn, batch, run_async)

    def _store_reward(self, batch: DataProto, job: RewardJob) -> list[str]:
        """Wait for `job`; write `token_level_scores` (B, R) and the extra per-row fields; return their names."""
        result = job.result()
        batch.batch[K.TOKEN_LEVEL_SCORES] = result["reward_tensor"]
        extra = result.get("reward_extra_info", {}) or {}
        for name, values in extra.items():
            batch.non_tensor_batch[name] = np.asarray(values, dtype=object)
        return list(extra)

    def _compute_old_log_prob(self, batch: DataProto, metrics: dict[str, Any]) -> None:
        """`old_log_probs` from the actor; in rollout_correction.bypass_mode, the rollout's own log-probs."""
        if self.algo.rollout_correction.bypass_mode:  # the actor's loss corrects against the current policy
            batch.batch[K.OLD_LOG_PROBS] = _rollout_log_probs(batch).clone()
            batch.meta_info[K.META_BYPASS_CORRECTION] = _as_dict(self.algo.rollout_correction)
            return
        load_step = moe_load.due(self.config.actor_rollout_ref.rollout.moe_load_balance_metrics_interval,
                                 self.global_steps)
        batch.meta_info[K.META_MOE_LOAD] = load_step
        out = self.actor_rollout_wg.compute_log_prob(batch)
        batch.meta_info.pop(K.META_MOE_LOAD)
        counts = out.batch.pop(K.MOE_EXPERT_COUNTS, None)
        if counts is not None:
            metrics.update(moe_load.load_balance_metrics(counts.sum(dim=0)))
        entropys = out.batch.pop(K.ENTROPYS, None)
        if entropys is not None:
            actor = self.config.actor_rollout_ref.actor
            metrics["actor/entropy"] = core_algos.agg_loss(
                entropys, batch.batch[K.RESPONSE_MASK], actor.loss_agg_mode, loss_scale_factor=actor.loss_scale_factor
            ).item()
        batch.union(out)
        if K.ROLLOUT_LOG_PROBS in batch.batch:
            from rlpost.rollout.drift import rollout_probs_diff

            drift = rollout_probs_diff(batch.batch[K.ROLLOUT_LOG_PROBS], batch.batch[K.OLD_LOG_PROBS],
                                       batch.batch[K.RESPONSE_MASK])
            metrics.update(drift)
            if drift["training/rollout_probs_diff_max"] > self.config.trainer.rollout_drift_warn:
                logger.warning("rollout and actor probabilities differ by up to %.3f at step %d: check "
                               "dtype / sampling settings", drift["training/rollout_probs_diff_max"],
                               self.global_steps)

    def _apply_rollout_correction(self, batch: DataProto, metrics: dict[str, Any]) -> None:
        """Importance weights `rollout_is_weights` (B, R) and/or rejection (a narrower `response_mask`) from
        the actor's and the engine's log-probs (algorithm.rollout_correction)."""
        weights, mask, rc_metrics = compute_rollout_correction(
            batch.batch[K.OLD_LOG_PROBS], _rollout_log_probs(batch), batch.batch[K.RESPONSE_MASK],
            self.algo.rollout_correction)
        if weights is not None:
            batch.batch[K.ROLLOUT_IS_WEIGHTS] = weights
        batch.batch[K.RESPONSE_MASK] = mask
        metrics.update(rc_metrics)

    def _compute_advantage(self, batch: DataProto, metrics: dict[str, Any]) -> None:
        """`token_level_rewards` (scores minus the in-reward KL), `advantages` and `returns` (B, R)."""
        mask = batch.batch[K.RESPONSE_MASK]
        scores = batch.batch[K.TOKEN_LEVEL_SCORES]
        if self.kl_ctrl_in_reward is not None:
            rewards, kl_metrics = core_algos.apply_kl_penalty(
                scores, batch.batch[K.OLD_LOG_PROBS], batch.batch[K.REF_LOG_PROB], mask, self.kl_ctrl_in_reward,
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
            non_tensor_batch=batch.non_tensor_batch, old_log_probs=batch.batch.get(K.OLD_LOG_PROBS),
            sum_pi_squared=batch.batch.get(K.SUM_PI_SQUARED), rollout_is_weights=batch.batch.get(K.ROLLOUT_IS_WEIGHTS),
            rollout_log_probs=batch.batch.get(K.ROLLOUT_LOG_PROBS),
        )
        batch.batch[K.ADVANTAGES], batch.batch[K.RETURNS] = adv, ret
        for feature in self.features:  # e.g. CoDaPO's focused batch, GDPO's component metrics, PF-PPO's resampling
            feature.after_advantage(batch, metrics)

    def _dump_rollouts(self, batch: DataProto, reward_keys: list[str]) -> None:
        out_dir = self.config.trainer.rollout_data_dir
        if out_dir:
            extra = {k: list(batch.non_tensor_batch[k]) for k in reward_keys}
            dump_generations(self.tokenizer, batch, out_dir, self.global_steps, extra)


def _reward_metrics(batch: DataProto, step: int) -> dict[str, Any]:
    """Counts of the reward's special outcomes: samples the prime manager scored 0.0 by time-out, code samples
    scored in the sandbox (`rlpost.reward.score.code.sandbox_metrics`; the step's slowest also get a console
    line) and samples scored by a generative judge (`rlpost.reward.judge.judge_metrics`)."""
    out = {**sandbox_metrics(batch.non_tensor_batch), **judge_metrics(batch.non_tensor_batch)}
    if "reward_timeout" in batch.non_tensor_batch:
        out["reward/timeout_count"] = int(np.sum(batch.non_tensor_batch["reward_timeout"]))
    if slowest := slowest_samples(batch.non_tensor_batch):
        print(f"[rlpost] step {step} slowest sandbox samples: {format_slowest(slowest)}")
    return out


def _as_dict(section: Any) -> dict[str, Any]:
    """A typed config section (or a DictConfig a verl-style caller gave) as a plain dict for the workers."""
    if dataclasses.is_dataclass(section):
        return dataclasses.asdict(section)
    from omegaconf import OmegaConf

    return OmegaConf.to_container(section, resolve=True) if OmegaConf.is_config(section) else dict(section)


def _rollout_log_probs(batch: DataProto) -> torch.Tensor:
    if K.ROLLOUT_LOG_PROBS not in batch.batch:
        raise RuntimeError(f"algorithm.rollout_correction needs the rollout engine's log-probs (batch key "
                           f"{K.ROLLOUT_LOG_PROBS!r}): set actor_rollout_ref.rollout.calculate_log_probs=true")
    return batch.batch[K.ROLLOUT_LOG_PROBS]
