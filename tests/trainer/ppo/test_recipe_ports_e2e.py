"""Two recipes written the way verl's recipes are, ported by renaming `verl` to `rlpost`, each training 2 steps
on CPU (2 worker processes, real Ray, the vLLM CPU engine, a tiny model):

- a DAPO-style `RayPPOTrainer` subclass whose own `fit()` drives every phase through the trainer's public
  helpers (`_get_gen_batch`, the worker groups, `compute_reward`, `compute_advantage`, `update_actor`,
  `checkpoint_manager.update_weights()`, the metric helpers) with dynamic sampling of varied groups;
- a subclass adding a role of its own: a worker class on its own resource pool, whose method uses a dispatch
  mode registered with `register_dispatch_mode` (each prompt's whole group on one rank), scoring the rollouts.
"""

from __future__ import annotations

import math
import sys
import uuid
from collections import defaultdict

import numpy as np
import pytest
import ray
import torch

from rlpost import DataProto
from rlpost.single_controller.base import Dispatch, Worker, register
from rlpost.single_controller.base.decorator import register_dispatch_mode
from rlpost.single_controller.ray import RayClassWithInitArgs, RayWorkerGroup, init_ray
from rlpost.trainer.ppo.core_algos import agg_loss
from rlpost.trainer.ppo.metric_utils import compute_data_metrics, compute_throughout_metrics, compute_timing_metrics
from rlpost.trainer.ppo.ray_trainer import RayPPOTrainer, ResourcePoolManager, Role, compute_advantage
from rlpost.trainer.ppo.reward import compute_reward, load_reward_manager
from rlpost.trainer.ppo.launch import load_tokenizer
from rlpost.utils.metric import reduce_metrics
from rlpost.utils.profiler import marked_timer
from rlpost.utils.tracking import Tracking
from rlpost.workers.fsdp_workers import ActorRolloutRefWorker
from test_recipe_api import assert_finite, compose_config, logged_steps, workspace  # noqa: F401 (fixture)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]


class DAPOStyleTrainer(RayPPOTrainer):
    """verl's DAPO recipe pattern: its own loop; groups whose scores do not vary are dropped and more prompts are
    generated until `data.train_batch_size` varied groups are kept."""

    def fit(self):
        logger = Tracking(project_name=self.config.trainer.project_name,
                          experiment_name=self.config.trainer.experiment_name,
                          default_backend=self.config.trainer.logger, config=self.config.to_dict())
        self.global_steps = 0
        self._load_checkpoint()
        self.checkpoint_manager.update_weights()
        self.history, self.trained_batches = [], []
        self.global_steps += 1
        n = self.config.actor_rollout_ref.rollout.n
        timing_raw, batch, num_prompt_in_batch, num_gen_batches = defaultdict(float), None, 0, 0
        for _epoch in range(self.config.trainer.total_epochs):
            for batch_dict in self.train_dataloader:
                metrics = {}
                new_batch = DataProto.from_single_dict(batch_dict)
                num_gen_batches += 1
                gen_batch = self._get_gen_batch(new_batch).repeat(repeat_times=n, interleave=True)
                is_last_step = self.global_steps >= self.total_training_steps
                with marked_timer("step", timing_raw):
                    with marked_timer("gen", timing_raw, "red"):
                        gen_batch_output = self.actor_rollout_wg.generate_sequences(gen_batch)
                    new_batch.non_tensor_batch["uid"] = np.array([str(uuid.uuid4()) for _ in range(len(new_batch))],
                                                                 dtype=object)
                    new_batch = new_batch.repeat(repeat_times=n, interleave=True).union(gen_batch_output)
                    with marked_timer("reward", timing_raw, "yellow"):
                        reward_tensor, reward_extra_infos_dict = compute_reward(new_batch, self.reward_fn)
                        new_batch.batch["token_level_scores"] = reward_tensor
                        new_batch.batch["token_level_rewards"] = new_batch.batch["token_level_scores"]
                    seq_reward = new_batch.batch["token_level_scores"].sum(dim=-1).numpy()
                    by_uid = defaultdict(list)
                    for uid, value in zip(new_batch.non_tensor_batch["uid"], seq_reward):
                        by_uid[uid].append(value)
                    kept = {uid for uid, values in by_uid.items() if np.std(values) > 0 or len(values) == 1}
                    num_prompt_in_batch += len(kept)
                    rows = [i for i, uid in enumerate(new_batch.non_tensor_batch["uid"]) if uid in kept]
                    new_batch = new_batch[rows]
                    batch = new_batch if batch is None else DataProto.concat([batch, new_batch])
                    if num_prompt_in_batch < self.config.data.train_batch_size:
                        max_gen = self.config.algorithm.filter_groups.max_num_gen_batches
                        if max_gen <= 0 or num_gen_batches < max_gen:
                            continue
                        raise ValueError(f"{num_gen_batches=} >= {max_gen=}")
                    batch = batch[: self.config.data.train_batch_size * n]
                    batch.meta_info["global_token_num"] = torch.sum(batch.batch["attention_mask"], dim=-1).tolist()
                    with marked_timer("old_log_prob", timing_raw, "blue"):
                        old_log_prob = self.actor_rollout_wg.compute_log_prob(batch)
                        entropy = agg_loss(loss_mat=old_log_prob.batch["entropys"],
                                           loss_mask=batch.batch["response_mask"],
                                           loss_agg_mode=self.config.actor_rollout_ref.actor.loss_agg_mode)
                        metrics["actor/entropy"] = entropy.detach().item()
                        old_log_prob.batch.pop("entropys")
                        batch = batch.union(old_log_prob)
                    with marked_timer("adv", timing_raw, "brown"):
                        batch = compute_advantage(batch, adv_estimator=self.config.algorithm.adv_estimator,
                                                  gamma=self.config.algorithm.gamma, lam=self.config.algorithm.lam,
                                                  num_repeat=n, norm_adv_by_std_in_grpo=True)
                    with marked_timer("update_actor", timing_raw, "red"):
                        actor_output = self.actor_rollout_wg.update_actor(batch)
                    with marked_timer("update_weights", timing_raw, "red"):
                        self.checkpoint_manager.update_weights()
                    metrics.update(reduce_metrics(actor_output.meta_info["metrics"]))
                metrics.update(compute_data_metrics(batch=batch, use_critic=self.use_critic))
                metrics.update(compute_timing_metrics(batch=batch, timing_raw=timing_raw))
                metrics.update(compute_throughout_metrics(batch=batch, timing_raw=timing_raw,
                                                          n_gpus=self.resource_pool_manager.get_n_gpus()))
                metrics["train/num_gen_batches"] = num_gen_batches
                logger.log(data=metrics, step=self.global_steps)
                self.history.append(metrics)
                self.trained_batches.append((list(batch.non_tensor_batch["uid"]), seq_reward_of(batch)))
                timing_raw, batch, num_prompt_in_batch, num_gen_batches = defaultdict(float), None, 0, 0
                if is_last_step:
                    logger.finish()
                    return metrics
                self.global_steps += 1
        return {}


def seq_reward_of(batch: DataProto) -> list[float]:
    return batch.batch["token_level_scores"].sum(dim=-1).tolist()


def _roles(config):
    mapping = {Role.ActorRollout: ray.remote(ActorRolloutRefWorker)}
    return mapping, {Role.ActorRollout: "global_pool"}


def test_dapo_style_recipe_with_its_own_fit(workspace):  # noqa: F811 (the imported fixture)
    config = compose_config(workspace, "dapo_fit", "algorithm.filter_groups.max_num_gen_batches=20",
                            f"custom_reward_function.path={workspace['root'] / 'parity.py'}")
    tokenizer = load_tokenizer(config)
    role_worker_mapping, mapping = _roles(config)
    init_ray(config.ray_init)
    try:
        trainer = DAPOStyleTrainer(
            config=config, tokenizer=tokenizer, role_worker_mapping=role_worker_mapping,
            resource_pool_manager=ResourcePoolManager(resource_pool_spec={"global_pool": [2]}, mapping=mapping),
            ray_worker_group_cls=RayWorkerGroup, reward_fn=load_reward_manager(config, tokenizer, num_examine=0))
        trainer.init_workers()
        last = trainer.fit()
    finally:
        ray.shutdown()
    assert trainer.global_steps == 2 and len(trainer.history) == 2 and last is trainer.history[-1]
    for uids, scores in trainer.trained_batches:
        assert len(uids) == 4 * 2  # exactly train_batch_size groups of rollout.n responses
        by_uid = defaultdict(set)
        for uid, score in zip(uids, scores):
            by_uid[uid].add(score)
        assert len(by_uid) == 4 and all(len(s) == 2 for s in by_uid.values()), by_uid  # every kept group varies
    for row in trainer.history:
        for name in ("actor/pg_loss", "actor/entropy", "actor/grad_norm", "timing_s/gen", "timing_s/update_actor",
                     "perf/throughput", "critic/advantages/max"):
            assert math.isfinite(row[name]), (name, row[name])
        # a varied group of two has GRPO advantages +-1/sqrt(2) (normalised by the unbiased std)
        assert row["critic/advantages/max"] == pytest.approx(2 ** -0.5, abs=1e-4)
    # parity scores vary in about a quarter of the groups: 4 varied groups from one batch of 4 is rare
    assert sum(row["train/num_gen_batches"] for row in trainer.history) >= 3


# --- a role of its own, with its own dispatch mode -------------------------------------------------------------
ROW = "recipe_row"  # the row's position in the batch the driver dispatched


def dispatch_by_group(worker_group, data: DataProto):
    """Every rank gets whole prompt groups (`uid`), dealt round-robin; each row remembers its position."""
    data.batch[ROW] = torch.arange(len(data))
    uids = list(dict.fromkeys(data.non_tensor_batch["uid"]))
    rank_of = {uid: i % worker_group.world_size for i, uid in enumerate(uids)}
    parts = [data.select_idxs([i for i, u in enumerate(data.non_tensor_batch["uid"]) if rank_of[u] == r])
             for r in range(worker_group.world_size)]
    data.batch.pop(ROW)
    return (parts,), {}


def collect_in_row_order(worker_group, outputs):
    """The ranks' rows put back in the dispatched order."""
    out = DataProto.concat(outputs)
    order = torch.argsort(out.batch.pop(ROW))
    return out.select_idxs(order)


DP_BY_GROUP = register_dispatch_mode("RECIPE_DP_BY_GROUP", dispatch_by_group, collect_in_row_order)


class GroupLengthRewardWorker(Worker):
    """The recipe's role: a group-relative reward, 1 for a response shorter than its group's mean length (at its
    last token), which needs each group whole on one rank."""

    @register(dispatch_mode=Dispatch.RECIPE_DP_BY_GROUP)
    def score_groups(self, data: DataProto) -> DataProto:
        mask = data.batch["response_mask"]
        lengths = mask.sum(dim=-1).float()
        uids = data.non_tensor_batch["uid"]
        group_mean = {u: lengths[uids == u].mean() for u in set(uids)}
        scores = torch.zeros_like(mask, dtype=torch.float32)
        for i, u in enumerate(uids):
            scores[i, max(int(lengths[i]) - 1, 0)] = float(lengths[i] < group_mean[u])
        seen = torch.tensor([int((uids == u).sum()) for u in uids])
        return DataProto.from_dict({"rm_scores": scores, ROW: data.batch[ROW], "group_rows_seen": seen,
                                    "scored_on_rank": torch.full((len(data),), self.rank)})


class GroupRewardTrainer(RayPPOTrainer):
    """Adds the role on a pool of its own and takes the step's rewards from it."""

    def init_workers(self):
        super().init_workers()
        pool = self.resource_pool_manager.resource_pool_dict["group_reward_pool"]
        self.group_reward_wg = self.ray_worker_group_cls(
            resource_pool=pool, ray_cls_with_init=RayClassWithInitArgs(ray.remote(GroupLengthRewardWorker)))
        self.scored = []

    def _start_reward(self, batch, run_async):
        from rlpost.trainer.ppo.reward_job import RewardJob

        return RewardJob(self._group_reward, batch, run_async=False)

    def _group_reward(self, data: DataProto, return_dict: bool = True):
        out = self.group_reward_wg.score_groups(data)
        self.scored.append((data.select(batch_keys=["response_mask"], non_tensor_batch_keys=["uid"]), out))
        return {"reward_tensor": out.batch["rm_scores"], "reward_extra_info": {}}


def test_recipe_role_with_its_own_worker_class_and_dispatch_mode(workspace):  # noqa: F811
    config = compose_config(workspace, "group_role", "ray_init.num_cpus=4")
    tokenizer = load_tokenizer(config)
    role_worker_mapping, mapping = _roles(config)
    pools = ResourcePoolManager(resource_pool_spec={"global_pool": [2], "group_reward_pool": [2]}, mapping=mapping)
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import test modules
    init_ray(config.ray_init)
    try:
        trainer = GroupRewardTrainer(config=config, tokenizer=tokenizer, role_worker_mapping=role_worker_mapping,
                                     resource_pool_manager=pools, ray_worker_group_cls=RayWorkerGroup,
                                     reward_fn=load_reward_manager(config, tokenizer, num_examine=0))
        trainer.init_workers()
        trainer.fit()
    finally:
        ray.shutdown()
    assert len(trainer.scored) == 2
    for sent, out in trainer.scored:
        assert out.batch["group_rows_seen"].tolist() == [2] * 8  # both responses of a prompt on the same rank
        assert set(out.batch["scored_on_rank"].tolist()) == {0, 1}
        lengths, uids = sent.batch["response_mask"].sum(dim=-1).float(), sent.non_tensor_batch["uid"]
        expected = torch.zeros_like(out.batch["rm_scores"])
        for i, u in enumerate(uids):  # the reward recomputed here, row by row, in the order sent
            expected[i, max(int(lengths[i]) - 1, 0)] = float(lengths[i] < lengths[uids == u].mean())
        torch.testing.assert_close(out.batch["rm_scores"], expected)
    for row in logged_steps(workspace, "group_role"):
        assert_finite(row, "actor/pg_loss", "critic/score/mean", "timing_s/reward", "timing_s/update_actor")
