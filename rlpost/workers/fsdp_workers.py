"""FSDP2 role workers: `ActorRolloutRefWorker` (actor / rollout / ref in one process) and `CriticWorker`.

Each method is registered for the worker group (`DP_COMPUTE_PROTO` for data, `ONE_TO_ALL` for init and
checkpoints) and stays directly callable on a plain instance. The config (the composed group, DictConfig or
its typed dataclass) is only read, never rewritten: its batch sizes are global and counted in prompts, and
`__init__` derives the rows per rank under their own name (`mini_batch_rows`). Unsupported options are
refused at start-up (`rlpost/trainer/config/unsupported.py`), not here.
"""

from __future__ import annotations

import shutil
import time
from typing import Any

import torch

from rlpost import keys
from rlpost.config.convert import typed_group
from rlpost.config.schema import CriticConfig
from rlpost.config.schema_workers import ActorRolloutRefConfig
from rlpost.protocol import DataProto
from rlpost.single_controller.base import Dispatch, register
from rlpost.engine.activation_offload import enable_activation_offload
from rlpost.checkpoint.manager import prune_oldest
from rlpost.utils.distributed import consecutive_groups, init_distributed
from rlpost.engine.fsdp import (apply_fsdp2, compute_dtype, load_model_to, load_shards_from_rank0,
                               move_optimizer, offload_model, reshard, to_dtype)
from rlpost.engine.lora import apply_lora
from rlpost.utils.lora_config import lora_enabled
from rlpost.engine.vision import freeze_vision_tower
from rlpost.utils.model import is_vision_language, load_for_sharding
from rlpost.utils.optim import build_lr_scheduler, build_optimizer
from rlpost.utils.profiler import lifetime_peaks, phase
from rlpost.utils.shm import local_model_path
from rlpost.utils.determinism import determinism_seed, enable_full_determinism
from rlpost.utils.tokenizer import auto_tokenizer, hf_processor
from rlpost.engine.ulysses import SequenceParallel, new_sequence_parallel, sp_size, use_ulysses_attention
from rlpost.workers.actor import DataParallelPPOActor
from rlpost.workers.batching import group_rows, own_rows, rows_per_rank, sp_parts
from rlpost.workers.critic import DataParallelPPOCritic
from rlpost.checkpoint.fsdp import load_fsdp_checkpoint, save_fsdp_checkpoint
from rlpost.workers.parts import EngineSync, ModelPart, StepWatch, engine_sync
from rlpost.workers.profiling import ProfiledWorker

ROLES = ("actor", "rollout", "ref", "actor_rollout", "actor_rollout_ref")
DEFAULT_CONTENTS = ("model", "optimizer", "extra")


def _on_device(data: DataProto, device: str) -> DataProto:
    """A view of `data` with its tensors on `device` (the caller's batch is left where it is).

    Batches arrive on CPU (Ray moves CPU tensors only); the models live on `device`.
    """
    tensors = {k: v.to(device, non_blocking=True) for k, v in data.batch.items()}
    return DataProto(batch=tensors, non_tensor_batch=data.non_tensor_batch, meta_info=data.meta_info)


def _to_cpu(tensors: dict[str, torch.Tensor | None]) -> dict[str, torch.Tensor]:
    """Results leave the worker on CPU, so nothing CUDA goes through Ray (None entries dropped)."""
    return {k: v.cpu() for k, v in tensors.items() if v is not None}


def _free_cached_blocks(device: str) -> None:
    """Hand the caching allocator's free blocks back to the driver before the rollout engine wakes: the
    update's peak would otherwise stay reserved beside the engine's gpu_memory_utilization share."""
    if device == "cuda":
        torch.cuda.empty_cache()


def _timed(metrics: dict, name: str, start: float) -> None:
    metrics[f"timing_s/{name}"] = time.perf_counter() - start


def memory_metrics() -> dict[str, float]:
    """Peak device memory of this worker on GPU; its resident set size on CPU (GiB)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        allocated, reserved = lifetime_peaks()  # the phases reset the allocator's peak statistics
        return {"perf/max_memory_allocated_gb": allocated / 2**30, "perf/max_memory_reserved_gb": reserved / 2**30}
    import psutil

    return {"perf/cpu_memory_used_gb": psutil.Process().memory_info().rss / 2**30}


class _FSDPRole(ProfiledWorker):
    """Shared start-up and checkpoint plumbing of the two FSDP workers."""

    def __init__(self, timeout_s: float = 1800.0) -> None:
        super().__init__()
        init_distributed(self.device, timeout_s=timeout_s)
        self._saved: list[str] = []

    def _offload(self, module: torch.nn.Module, optimizer: Any, fsdp_cfg: Any) -> None:
        reshard(module)  # the end of a phase: no gathered parameters past it (reshard_after_forward=false)
        if fsdp_cfg.param_offload and not fsdp_cfg.offload_policy:
            offload_model(module)
        if optimizer is not None and fsdp_cfg.optimizer_offload:
            move_optimizer(optimizer, "cpu")

    def _onload(self, module: torch.nn.Module, optimizer: Any, fsdp_cfg: Any) -> None:
        if fsdp_cfg.param_offload and not fsdp_cfg.offload_policy:
            load_model_to(module, self.device)
        if optimizer is not None and fsdp_cfg.optimizer_offload:
            move_optimizer(optimizer, "cpu" if fsdp_cfg.offload_policy else self.device)

    def _shard(self, module: torch.nn.Module, fsdp_cfg: Any, trainable: bool,
               full_state: dict[str, torch.Tensor] | None = None) -> None:
        """FSDP2 over all ranks with this role's `fsdp_config`; with `full_state` (`load_for_sharding`: rank 0's
        state dict, {} elsewhere) every rank's shards are then filled from rank 0."""
        apply_fsdp2(module, self.device, fsdp_size=fsdp_cfg.fsdp_size,
                    reshard_after_forward=fsdp_cfg.reshard_after_forward, offload_policy=fsdp_cfg.offload_policy,
                    min_num_params=fsdp_cfg.wrap_policy.min_num_params, trainable=trainable,
                    param_dtype=fsdp_cfg.mixed_precision.param_dtype, forward_prefetch=fsdp_cfg.forward_prefetch)
        if full_state is not None:
            load_shards_from_rank0(module, full_state)

    def _build_trainable(self, model_cfg: Any, optim_cfg: Any, fsdp_cfg: Any, value_model: bool,
                         total_training_steps: int | None, group: str, freeze_vision: bool = False):
        """Load (master weights in `fsdp_config.model_dtype`), shard, then the optimiser (`optim.optimizer`,
        AdamW by default) + an LR schedule over
        `total_training_steps` (None: `optim.total_training_steps`, see `rlpost.utils.optim.resolve_total_steps`).
        With `model.enable_activation_offload` the forward's saved activations wait on the host.

        With LoRA on (`lora_rank` > 0 or a `lora_adapter_path`) the base loads in the compute dtype and stays
        frozen; PEFT adapters (float32) are the only parameters the optimizer sees. Returns (module, optimizer,
        scheduler, peft model or None); `module` is the HF model (holding the adapters), the one that is sharded
        and run.
        """
        lora = lora_enabled(model_cfg)
        dtype = compute_dtype(self.device, fsdp_cfg.mixed_precision.param_dtype) if lora else \
            to_dtype(fsdp_cfg.model_dtype)
        module, full_state = load_for_sharding(model_cfg, dtype, value_model, fsdp_cfg.offload_policy)
        peft_model = apply_lora(module, model_cfg, group, value_model) if lora else None
        if freeze_vision:  # actor.freeze_vision_tower: before sharding, so the optimizer never holds the tower
            freeze_vision_tower(module)
        self._shard(module, fsdp_cfg, trainable=True, full_state=full_state)
        del full_state  # rank 0's full copy
        if model_cfg.enable_activation_offload:
            enable_activation_offload(module, self.device)
        optim_key = "critic.optim" if group.startswith("critic") else "actor_rollout_ref.actor.optim"
        optimizer = build_optimizer([p for p in module.parameters() if p.requires_grad], optim_cfg, optim_key)
        return module, optimizer, build_lr_scheduler(optimizer, optim_cfg, total_training_steps), peft_model

    def _save(self, local_path: str, module, optimizer, scheduler, fsdp_cfg, global_step: int,
              max_ckpt_to_keep: int | None, save_contents, peft_model: Any = None) -> None:
        self._onload(module, optimizer, fsdp_cfg)
        # a vision-language model's processor writes the tokenizer plus its image processor and template
        files = getattr(self, "processor", None) or self.tokenizer
        save_fsdp_checkpoint(local_path, module, optimizer, scheduler, save_contents, files,
                             None if peft_model is None else peft_model.peft_config["default"])
        self._offload(module, optimizer, fsdp_cfg)
        if local_path not in self._saved:
            self._saved.append(local_path)
        if self.rank == 0:
            prune_oldest(self._saved, max_ckpt_to_keep)
        if max_ckpt_to_keep is not None and max_ckpt_to_keep > 0:
            del self._saved[:-max_ckpt_to_keep]

    def _load(self, local_path: str, module, optimizer, scheduler, fsdp_cfg, load_contents,
              del_local_after_load: bool, lora: bool = False) -> list[str]:
        self._onload(module, optimizer, fsdp_cfg)
        notes = load_fsdp_checkpoint(local_path, module, optimizer, scheduler, load_contents, lora)
        self._offload(module, optimizer, fsdp_cfg)
        if del_local_after_load and self.rank == 0:
            shutil.rmtree(local_path, ignore_errors=True)
        return notes

    @staticmethod
    def _metrics_out(metrics: dict[str, Any]) -> DataProto:
        return DataProto(meta_info={keys.META_METRICS: {**metrics, **memory_metrics()}})


class ActorRolloutRefWorker(_FSDPRole):
    """Actor (trainable FSDP2 policy), rollout engine (optional) and reference policy (frozen FSDP2 copy).

    Args:
        config: the typed `actor_rollout_ref` group (model, actor, rollout, ref), or its DictConfig (converted
            and checked here, once); role `rollout` reads only model and rollout.
        role: one of ROLES.

    Attributes:
        mini_batch_rows: rows per PPO mini-batch on this rank (actor.ppo_mini_batch_size x rollout.n / ranks);
            None without an actor.
        actor_peft: the PEFT model around `actor_module` with LoRA (`lora_enabled`), else None. The
            reference policy of a LoRA actor is the actor with its adapters disabled (no second model).
    """

    def __init__(self, config: Any, role: str) -> None:
        if role not in ROLES:
            raise ValueError(f"role={role!r} is not one of {ROLES}")
        config = typed_group(config, ActorRolloutRefConfig, "actor_rollout_ref.")
        super().__init__(timeout_s=config.nccl_timeout)  # actor_rollout_ref.nccl_timeout
        self.config = config
        self.role = role
        self._is_actor = role in ("actor", "actor_rollout", "actor_rollout_ref")
        self._is_rollout = role in ("rollout", "actor_rollout", "actor_rollout_ref")
        self._is_ref = role in ("ref", "actor_rollout_ref")
        # The parts (`rlpost.workers.parts`), built by init_model as the role asks.
        self.actor_part: ModelPart | None = None
        self.ref_part: ModelPart | None = None
        self.engine_sync: EngineSync | None = None  # how a colocated engine gets the actor's weights
        self.actor_steps: StepWatch | None = None  # actor steps the colocated engine has not received yet
        self.actor = self.ref_policy = self.rollout = None  # verl's names: the parts' runners and the engine
        self.agent_rollout = None  # multi-turn rollouts (rollout.multi_turn.enable), set in init_model
        self._tp_group, self._tp_rank = None, 0  # rollout tensor-parallel peers, set in init_model
        self.mini_batch_rows = None
        # Ulysses groups (None without sequence parallelism); the data-parallel size is world / SP size.
        self.actor_sp = new_sequence_parallel(config.actor.ulysses_sequence_parallel_size) \
            if self._is_actor else None
        self.ref_sp = new_sequence_parallel(config.ref.ulysses_sequence_parallel_size) if self._is_ref else None
        if self._is_actor:
            dp = self.world_size // config.actor.ulysses_sequence_parallel_size
            self.mini_batch_rows = rows_per_rank(config.actor.ppo_mini_batch_size, config.rollout.n, dp,
                                                 "actor_rollout_ref.actor.ppo_mini_batch_size")

    def _log_prob_meta(self, data: DataProto, group: Any, sp: SequenceParallel | None) -> None:
        """Forward-only micro-batching for `compute_(ref_)log_prob` from `group`'s log_prob_* keys
        (per-device sizes: deprecated global ones were mapped at start-up). The token budget is per device,
        so a Ulysses group, whose devices share each micro-batch, packs SP size times as many tokens."""
        meta = data.meta_info
        meta.setdefault(keys.META_TEMPERATURE, self.config.rollout.temperature)
        meta["micro_batch_size"] = group.log_prob_micro_batch_size_per_gpu
        meta["use_dynamic_bsz"] = bool(group.log_prob_use_dynamic_bsz)
        meta["max_token_len"] = int(group.log_prob_max_token_len_per_gpu) * sp_size(sp)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self, total_training_steps: int | None = None) -> None:
        """Build the actor (FSDP2 + AdamW + LR schedule), the frozen reference and the rollout engine.

        Args:
            total_training_steps: optimiser steps the actor's LR schedule spans (the trainer's step count);
                None: `actor.optim.total_training_steps` when > 0 (cosine needs one of them).
        """
        # (a generation-only worker's config has neither group)
        engines = ([self.config.actor.fsdp_config] if self._is_actor else []) + \
            ([self.config.ref.fsdp_config] if self._is_ref else [])
        seed = determinism_seed(engines)  # verl's full_determinism: one process, so either engine's turns it on
        if seed is not None:
            enable_full_determinism(seed)
        model_cfg = self.config.model
        model_path = local_model_path(model_cfg)  # the /dev/shm copy with model.use_shm
        self.tokenizer = auto_tokenizer().from_pretrained(model_cfg.tokenizer_path or model_path,
                                                         trust_remote_code=model_cfg.trust_remote_code)
        if model_cfg.custom_chat_template is not None:  # saved with hf_model checkpoints
            self.tokenizer.chat_template = model_cfg.custom_chat_template
        if self._is_actor:
            self.actor_part = self._actor_part(model_cfg, total_training_steps)
            self.actor = self.actor_part.policy
            if is_vision_language(self.actor_module.config):
                self.processor = hf_processor(model_cfg.tokenizer_path or model_path,
                                              trust_remote_code=model_cfg.trust_remote_code)
        if self._is_ref:
            self.ref_part = self._ref_part(model_cfg)
            self.ref_policy = self.ref_part.policy
        if self._is_rollout:
            self._rollout_part(model_path)
        if self._is_actor:
            self._offload(self.actor_module, self.actor_optimizer, self.config.actor.fsdp_config)

    # verl's names for the actor part's pieces (None without an actor)
    @property
    def actor_module(self):
        return self.actor_part.module if self.actor_part else None

    @property
    def actor_optimizer(self):
        return self.actor_part.optimizer if self.actor_part else None

    @property
    def actor_lr_scheduler(self):
        return self.actor_part.lr_scheduler if self.actor_part else None

    @property
    def actor_peft(self):
        return self.actor_part.peft if self.actor_part else None

    def _actor_part(self, model_cfg: Any, total_training_steps: int | None) -> ModelPart:
        """The trainable policy: sharded, with its optimiser and LR schedule (LoRA adapters when configured)."""
        acfg = self.config.actor
        module, optimizer, scheduler, peft = self._build_trainable(
            model_cfg, acfg.optim, acfg.fsdp_config, False, total_training_steps, "actor_rollout_ref.model",
            acfg.freeze_vision_tower)
        policy = DataParallelPPOActor(acfg, module, optimizer, model_cfg.use_remove_padding, self.mini_batch_rows,
                                      self.actor_sp, model_cfg.use_fused_kernels)
        if self.actor_sp is not None:
            use_ulysses_attention(module, self.actor_sp.size)
        if acfg.router_replay.mode == "R2":
            from rlpost.utils.router_replay import use_router_replay

            policy.router_replay = use_router_replay(module)
        return ModelPart(module, policy, acfg.fsdp_config, self.actor_sp, optimizer, scheduler, peft)

    def _ref_part(self, model_cfg: Any) -> ModelPart:
        """The frozen reference: a LoRA actor itself with its adapters disabled (the same module, hence the
        actor's sequence-parallel layout, checked at start-up), else a separate frozen FSDP module, even when
        it starts from the actor's weights (the actor moves). Frozen, it loads straight in the compute dtype
        (no fp32 master copy), or in bf16 when ref.fsdp_config.model_dtype asks for it."""
        actor = self.actor_part
        if actor is not None and actor.peft is not None:
            policy = DataParallelPPOActor(self.config.ref, actor.module, None, model_cfg.use_remove_padding,
                                          sp=actor.sp, use_fused_kernels=model_cfg.use_fused_kernels)
            return ModelPart(actor.module, policy, actor.fsdp_cfg, actor.sp, view=actor.peft.disable_adapter)
        ref_fsdp = self.config.ref.fsdp_config
        ref_dtype = to_dtype(ref_fsdp.model_dtype)
        if ref_dtype == torch.float32:
            ref_dtype = compute_dtype(self.device, ref_fsdp.mixed_precision.param_dtype)
        module, full_state = load_for_sharding(model_cfg, ref_dtype, offload_policy=ref_fsdp.offload_policy)
        self._shard(module, ref_fsdp, trainable=False, full_state=full_state)
        del full_state
        policy = DataParallelPPOActor(self.config.ref, module, None, model_cfg.use_remove_padding, sp=self.ref_sp,
                                      use_fused_kernels=model_cfg.use_fused_kernels)
        if self.ref_sp is not None:
            use_ulysses_attention(module, self.ref_sp.size)
        self._offload(module, None, ref_fsdp)
        return ModelPart(module, policy, ref_fsdp, self.ref_sp)

    def _rollout_part(self, model_path: str) -> None:
        """The engine, its weight-sync strategy, its tensor-parallel peers and (multi-turn) the agent loops;
        the engine starts from the actor's weights when this worker holds the actor."""
        from rlpost.rollout import build_rollout

        # Tensor-parallel peers (consecutive ranks, as vLLM lays them out) must feed their shared
        # engine the same prompts: `generate_sequences` gathers the peers' shards and splits the result.
        if self.world_size > 1:
            self._tp_group, self._tp_rank = consecutive_groups(self.config.rollout.tensor_model_parallel_size)
        self.engine_sync = engine_sync(self.actor_part, self.config)
        if self.engine_sync is not None:
            self.actor_steps = StepWatch(self.actor_optimizer)
        self.rollout = build_rollout(self.config.rollout, model_path, self.tokenizer, self.device,
                                     module=self.actor_module,
                                     lora_rank=self.engine_sync.engine_lora_rank if self.engine_sync else 0)
        if self.config.rollout.multi_turn.enable:
            from rlpost.workers.agent_rollout import AgentRollout

            self.agent_rollout = AgentRollout(self.config.rollout, self.tokenizer, arr_config=self.config)
        if self.engine_sync is not None:
            self._sync_weights()
        if self.config.rollout.free_cache_engine:
            self.rollout.sleep()

    @phase("update_weights")
    def _sync_weights(self) -> float:
        """Stream the actor's full params (HF names, rollout dtype) into the engine, gathered one bucket of
        `rollout.update_weights_bucket_megabytes` at a time.

        The engine may be asleep: `update_weights` wakes only what it needs (vLLM: the weights, not the
        KV cache). Every rank must consume the whole iterator: each bucket's all-gather is a collective.
        """
        start = time.perf_counter()
        fsdp_cfg = self.config.actor.fsdp_config
        self._onload(self.actor_module, None, fsdp_cfg)
        _free_cached_blocks(self.device)
        self.engine_sync.sync(self.rollout, to_dtype(self.config.rollout.dtype))
        self.actor_steps.synced()
        self._offload(self.actor_module, None, fsdp_cfg)
        return time.perf_counter() - start

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    @phase("gen")
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """Sample responses. Reads `input_ids`, `attention_mask`, `position_ids` (B, P); writes `prompts`,
        `responses`, `input_ids`, `attention_mask`, `position_ids`, `response_mask` (+ `rollout_log_probs`);
        meta_info metrics `timing_s/generate_sequences` and its parts `timing_s/gen_{wake,engine,sleep}`.
        With multi_turn.enable every row runs its agent loop instead (`rlpost.workers.agent_rollout`: reads
        `raw_prompt`, `agent_name`, `tools_kwargs`, `interaction_kwargs`; `response_mask` is 0 on tool and
        user tokens; adds `__num_turns__`, `agent_metrics`, `tool_rewards`, `turn_scores`)."""
        start = time.perf_counter()
        prompts.meta_info.setdefault(keys.META_EOS_TOKEN_ID, self.tokenizer.eos_token_id)
        prompts.meta_info.setdefault(keys.META_PAD_TOKEN_ID, self.tokenizer.pad_token_id)
        # A level-2 sleep dropped the weights (e.g. validation before training), or the actor stepped outside
        # update_actor (a recipe's own method; verl's hybrid engine syncs on entering generation too).
        if self.rollout.needs_sync or (self.actor_steps is not None and self.actor_steps.unsynced_steps):
            self._sync_weights()
        _free_cached_blocks(self.device)
        self.rollout.wake_up()
        woke = time.perf_counter()
        if self.agent_rollout is not None:
            out = self.agent_rollout.generate_in_block(self.rollout, prompts, self._tp_group, self._tp_rank)
        else:
            out = self._generate_with_tp_peers(prompts)
        generated = time.perf_counter()
        if self.config.rollout.free_cache_engine:
            self.rollout.sleep()
        metrics = dict(out.meta_info.get(keys.META_METRICS, {}))
        metrics.update({"timing_s/gen_wake": woke - start, "timing_s/gen_engine": generated - woke})
        _timed(metrics, "gen_sleep", generated)
        _timed(metrics, "generate_sequences", start)
        out.meta_info[keys.META_METRICS] = metrics
        return out

    def _generate_with_tp_peers(self, prompts: DataProto) -> DataProto:
        """Generate this rank's rows. With tensor parallelism the trainer still hands every rank its own
        shard (the actor's data-parallel layout); the peers of one engine concatenate their shards,
        generate all of them together and each keeps its own rows back."""
        rows, start = group_rows(prompts, self._tp_group, self._tp_rank)
        if self.config.rollout.mode == "async":
            from rlpost.rollout.async_mode import generate_concurrently

            return own_rows(generate_concurrently(self.rollout, rows), start, len(prompts))
        return own_rows(self.rollout.generate_sequences(rows), start, len(prompts))

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    @phase("old_log_prob")
    def compute_log_prob(self, data: DataProto) -> DataProto:
        """Reads `input_ids`, `attention_mask`, `position_ids`, `responses`; writes `old_log_probs`,
        `entropys` (B, R), `sum_pi_squared` (B, R) with actor.calculate_sum_pi_squared, and `student_topk_ids`
        (B, R, k) with meta_info `student_topk` = k. Micro-batching from rollout.log_prob_* keys."""
        fsdp_cfg = self.config.actor.fsdp_config
        self._onload(self.actor_module, None, fsdp_cfg)
        rows = len(data)
        data, start = group_rows(data, *sp_parts(self.actor_sp))
        self._log_prob_meta(data, self.config.rollout, self.actor_sp)
        load = bool(data.meta_info.get(keys.META_MOE_LOAD))
        replaying = self.actor.router_replay is not None  # R2: the update replays what this pass records
        if load and not replaying:  # record the routing for the load metrics alone, then stop recording
            from rlpost.utils.router_replay import use_router_replay

            self.actor.router_replay = use_router_replay(self.actor_module)
        try:
            stats = self.actor.compute_log_prob_stats(
                _on_device(data, self.device), calculate_entropy=True,
                calculate_sum_pi_squared=self.config.actor.calculate_sum_pi_squared)
        finally:
            if load and not replaying:
                self.actor.router_replay = None
        if load:
            stats[keys.MOE_EXPERT_COUNTS] = self._expert_counts(
                stats[keys.ROUTED_EXPERTS] if replaying else stats.pop(keys.ROUTED_EXPERTS), data)
        if data.meta_info.get(keys.META_STUDENT_TOPK):  # top-k distillation: the student's k likeliest ids
            stats[keys.STUDENT_TOPK_IDS] = self.actor.compute_topk(
                _on_device(data, self.device), int(data.meta_info[keys.META_STUDENT_TOPK]))["topk_ids"]
        self._offload(self.actor_module, None, fsdp_cfg)
        out = DataProto.from_dict(tensors=_to_cpu(stats),
                                  meta_info={keys.META_TEMPERATURE: data.meta_info[keys.META_TEMPERATURE]})
        return own_rows(out, start, rows)

    def _expert_counts(self, routed: torch.Tensor, data: DataProto) -> torch.Tensor:
        """(B, L, E) counts of the response tokens' routed experts (`rlpost.algos.moe_load`)."""
        from rlpost.algos.moe_load import row_expert_counts
        from rlpost.utils.model_traits import model_traits

        mask = torch.zeros(routed.shape[:2], dtype=torch.bool)
        width = data.batch[keys.RESPONSES].shape[1]
        # the generated tokens (RESPONSE_MASK leaves a multi-turn rollout's tool tokens out), else the real ones
        own = data.batch[keys.RESPONSE_MASK] if keys.RESPONSE_MASK in data.batch.keys() else \
            data.batch[keys.ATTENTION_MASK][:, -width:]
        mask[:, -width:] = own.bool().cpu()
        return row_expert_counts(routed.cpu(), mask, model_traits(self.actor_module.config).experts)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    @phase("ref")
    def compute_ref_log_prob(self, data: DataProto) -> DataProto:
        """Reads `input_ids`, `attention_mask`, `position_ids`, `responses`; writes `ref_log_prob` (B, R).
        A LoRA actor computes them itself with its adapters disabled (the base model is the reference)."""
        part = self.ref_part
        self._onload(part.module, None, part.fsdp_cfg)
        rows = len(data)
        data, start = group_rows(data, *sp_parts(part.sp))
        self._log_prob_meta(data, self.config.ref, part.sp)
        with part.view():
            log_probs, _ = part.policy.compute_log_prob(_on_device(data, self.device), calculate_entropy=False)
        self._offload(part.module, None, part.fsdp_cfg)
        return own_rows(DataProto.from_dict(tensors=_to_cpu({keys.REF_LOG_PROB: log_probs})), start, rows)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    @phase("update_actor", report=True)
    def update_actor(self, data: DataProto) -> DataProto:
        """PPO update, then weight sync into the rollout engine. Reads `input_ids`, `attention_mask`,
        `position_ids`, `responses`, `response_mask`, `old_log_probs`, `advantages` (+ `ref_log_prob` with
        use_kl_loss); writes meta_info metrics (actor/*, timing_s/update_actor, timing_s/update_weights)."""
        start = time.perf_counter()
        fsdp_cfg = self.config.actor.fsdp_config
        self._onload(self.actor_module, self.actor_optimizer, fsdp_cfg)
        data.meta_info.setdefault(keys.META_TEMPERATURE, self.config.rollout.temperature)
        data, _ = group_rows(data, *sp_parts(self.actor_sp))
        metrics: dict[str, Any] = self.actor.update_policy(_on_device(data, self.device))
        metrics["actor/lr"] = self.actor_lr_scheduler.get_last_lr()[0]
        self.actor_lr_scheduler.step()
        self._offload(self.actor_module, self.actor_optimizer, fsdp_cfg)
        _timed(metrics, "update_actor", start)
        if self.rollout is not None:
            metrics["timing_s/update_weights"] = self._sync_weights()
            # the engine's parts of it (vLLM: wake, load / adapter, reset)
            for part, seconds in getattr(self.rollout, "last_sync_breakdown", {}).items():
                metrics[f"timing_s/update_weights_{part}"] = seconds
        return self._metrics_out(metrics)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, local_path: str, global_step: int = 0, max_ckpt_to_keep: int | None = None,
                        save_contents: tuple = DEFAULT_CONTENTS) -> None:
        """Per-rank shards of model / optimizer / extra (LR schedule, RNG) (+ `hf_model`) into local_path."""
        self._save(local_path, self.actor_module, self.actor_optimizer, self.actor_lr_scheduler,
                   self.config.actor.fsdp_config, global_step, max_ckpt_to_keep, save_contents, self.actor_peft)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, local_path: str, load_contents: tuple = DEFAULT_CONTENTS,
                        del_local_after_load: bool = False) -> list[str]:
        """Restore what `save_checkpoint` wrote (same world size), then re-sync the rollout weights. Returns notes
        on configured values kept over the checkpoint's (a changed learning rate)."""
        notes = self._load(local_path, self.actor_module, self.actor_optimizer, self.actor_lr_scheduler,
                           self.config.actor.fsdp_config, load_contents, del_local_after_load,
                           self.actor_peft is not None)
        if self.rollout is not None:
            self._sync_weights()
        return notes


class CriticWorker(_FSDPRole):
    """Value model (token-classification head, one label) trained with the clipped value loss.

    Args:
        config: the typed `critic` group (model, optim, ppo_* batch keys, forward_* keys, cliprange_value), or
            its DictConfig (converted here, once); `rollout_n` (follows actor_rollout_ref.rollout.n) multiplies
            ppo_mini_batch_size.

    Attributes:
        mini_batch_rows: rows per PPO mini-batch on this rank (ppo_mini_batch_size x rollout_n / ranks).
        fsdp_config: `critic.model.fsdp_config` (verl keeps the critic's FSDP settings under its model).
    """

    def __init__(self, config: Any) -> None:
        super().__init__()
        config = typed_group(config, CriticConfig, "critic.")
        self.config = config
        self.sp = new_sequence_parallel(config.ulysses_sequence_parallel_size)
        self.mini_batch_rows = rows_per_rank(config.ppo_mini_batch_size, config.rollout_n,
                                             self.world_size // config.ulysses_sequence_parallel_size,
                                             "critic.ppo_mini_batch_size")
        self.fsdp_config = config.model.fsdp_config

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self, total_training_steps: int | None = None) -> None:
        """Load the value model from critic.model.path, shard it, build its optimiser + LR schedule.

        Args:
            total_training_steps: optimiser steps the LR schedule spans (the trainer's step count);
                None: `critic.optim.total_training_steps` when > 0 (cosine needs one of them).
        """
        seed = determinism_seed([self.fsdp_config])
        if seed is not None:
            enable_full_determinism(seed)
        model_cfg = self.config.model
        self.tokenizer = auto_tokenizer().from_pretrained(model_cfg.tokenizer_path,
                                                         trust_remote_code=model_cfg.trust_remote_code)
        self.module, self.optimizer, self.lr_scheduler, self.peft = self._build_trainable(
            model_cfg, self.config.optim, self.fsdp_config, True, total_training_steps, "critic.model")
        self.critic = DataParallelPPOCritic(self.config, self.module, self.optimizer,
                                            model_cfg.use_remove_padding, self.mini_batch_rows, self.sp)
        if self.sp is not None:
            use_ulysses_attention(self.module, self.sp.size)
        self._offload(self.module, self.optimizer, self.fsdp_config)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    @phase("values")
    def compute_values(self, data: DataProto) -> DataProto:
        """Reads `input_ids`, `attention_mask`, `position_ids`, `responses`; writes `values` (B, R)."""
        cfg = self.config
        self._onload(self.module, None, self.fsdp_config)
        rows = len(data)
        data, start = group_rows(data, *sp_parts(self.sp))
        data.meta_info["micro_batch_size"] = cfg.forward_micro_batch_size_per_gpu
        data.meta_info["use_dynamic_bsz"] = cfg.use_dynamic_bsz
        # a per-device token budget: the devices of a Ulysses group share each micro-batch
        data.meta_info["max_token_len"] = cfg.forward_max_token_len_per_gpu * sp_size(self.sp)
        values = self.critic.compute_values(_on_device(data, self.device))
        self._offload(self.module, None, self.fsdp_config)
        return own_rows(DataProto.from_dict(tensors=_to_cpu({keys.VALUES: values})), start, rows)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    @phase("update_critic", report=True)
    def update_critic(self, data: DataProto) -> DataProto:
        """Reads `input_ids`, `attention_mask`, `position_ids`, `responses`, `response_mask`, `values`,
        `returns`; writes meta_info metrics critic/vf_loss, vf_clipfrac, vpred_mean, grad_norm, lr."""
        start = time.perf_counter()
        self._onload(self.module, self.optimizer, self.fsdp_config)
        data, _ = group_rows(data, *sp_parts(self.sp))
        metrics: dict[str, Any] = self.critic.update_critic(_on_device(data, self.device))
        metrics["critic/lr"] = self.lr_scheduler.get_last_lr()[0]
        self.lr_scheduler.step()
        self._offload(self.module, self.optimizer, self.fsdp_config)
        _timed(metrics, "update_critic", start)
        return self._metrics_out(metrics)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, local_path: str, global_step: int = 0, max_ckpt_to_keep: int | None = None,
                        save_contents: tuple = DEFAULT_CONTENTS) -> None:
        """Per-rank shards of model / optimizer / extra (+ `hf_model`) into local_path."""
        self._save(local_path, self.module, self.optimizer, self.lr_scheduler, self.fsdp_config,
                   global_step, max_ckpt_to_keep, save_contents, self.peft)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, local_path: str, load_contents: tuple = DEFAULT_CONTENTS,
                        del_local_after_load: bool = False) -> list[str]:
        """Restore what `save_checkpoint` wrote (same world size); returns notes as the actor's does."""
        return self._load(local_path, self.module, self.optimizer, self.lr_scheduler, self.fsdp_config,
                          load_contents, del_local_after_load, self.peft is not None)
