"""The start-up memory estimate of a run: per phase, per device, from config.json and the typed config.

`memory_lines` is what the dry run prints; `check_memory_fit` raises before Ray starts when a phase
cannot fit the device, naming the knob and a value that fits (found by re-estimating with smaller values).
The arithmetic lives in `rlpost.utils.memory_estimate`.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, replace
from typing import Callable

from rlpost.config.schema import PPOTrainerConfig
from rlpost.trainer.config.batch_rules import n_devices
from rlpost.trainer.config.errors import ConfigError
from rlpost.trainer.config.roles import need_critic, need_reference_policy
from rlpost.utils.lora_config import lora_enabled
from rlpost.utils.memory_estimate import (CHUNK_TOKENS, GIB, OVERHEAD_BYTES, ModelShape, PhaseEstimate, TrainSetup,
                                          forward_bytes, load_shape, onloaded_bytes, resident_bytes,
                                          optimizer_state_bytes, update_bytes)

ARR = "actor_rollout_ref"


@dataclass(frozen=True)
class Knob:
    """A phase's size knob: its key, current value, and the phase estimate as a function of the value."""

    key: str
    value: float
    estimate: Callable[[float], PhaseEstimate]
    smaller: Callable[[float], float | None]  # the next value to try, None when none is left


def _setup(c: PPOTrainerConfig, fsdp, checkpointing: bool, entropy: bool, frozen: bool,
           value_head: bool, optim=None) -> TrainSetup:
    from rlpost.engine import triton_logprob  # imports torch: the config package itself stays without it

    rollout = c.actor_rollout_ref.rollout
    shards = fsdp.fsdp_size if fsdp.fsdp_size > 0 else n_devices(c)
    return TrainSetup(shards=shards, tokens_per_row=rollout.prompt_length + rollout.response_length,
                      logit_rows_per_row=0 if value_head else rollout.response_length + 1,
                      checkpointing=checkpointing, param_offload=fsdp.param_offload,
                      optimizer_offload=fsdp.optimizer_offload, offload_policy=fsdp.offload_policy,
                      entropy=entropy, frozen=frozen, gathered_pass=not fsdp.reshard_after_forward,
                      unit_params=fsdp.wrap_policy.min_num_params,
                      defer_grad_sync=fsdp.use_no_sync_for_gradient_accumulation,
                      chunk_tokens=(fsdp.entropy_from_logits_chunk_size if fsdp.entropy_from_logits_with_chunking
                                    else CHUNK_TOKENS),
                      float32_chunks=not triton_logprob.expected(c.trainer.device),
                      optim_bytes=8.0 if optim is None else optimizer_state_bytes(optim.optimizer,
                                                                                 optim.override_optimizer_config))


def _halve(v: float) -> float | None:
    return v // 2 if v > 1 else None


def _rows(s: TrainSetup, micro: int | None, dynamic: bool, max_tokens: int) -> tuple[TrainSetup, int]:
    """(setup, rows) of a micro-batch; with dynamic batch sizes one row of `max_tokens` tokens whose
    response share of logits matches a padded row's."""
    if not dynamic:
        return s, int(micro)
    share = s.logit_rows_per_row / s.tokens_per_row if s.tokens_per_row else 0
    return replace(s, tokens_per_row=max_tokens, logit_rows_per_row=math.ceil(max_tokens * share)), 1


class RunMemory:
    """Roles, shapes and knobs of one config; `phases(device_bytes)` gives the estimate."""

    def __init__(self, c: PPOTrainerConfig, actor: ModelShape, critic: ModelShape | None = None) -> None:
        self.c, self.actor, self.critic = c, actor, critic
        arr = c.actor_rollout_ref
        lora = lora_enabled(arr.model)
        self.actor_setup = _setup(c, arr.actor.fsdp_config, arr.model.enable_gradient_checkpointing,
                                  arr.actor.entropy_coeff != 0, lora, False, arr.actor.optim)
        self.ref_setup = None
        if need_reference_policy(c) and not lora:  # a LoRA actor is its own reference (adapters off)
            self.ref_setup = _setup(c, arr.ref.fsdp_config, False, False, True, False)
        self.critic_setup = None
        if critic is not None:
            cm = c.critic.model
            self.critic_setup = _setup(c, cm.fsdp_config, cm.enable_gradient_checkpointing, False,
                                       lora_enabled(cm), True, c.critic.optim)

    def resident(self) -> dict[str, int]:
        """Bytes per device kept between phases, by role part."""
        out = {f"actor {k}": v for k, v in resident_bytes(self.actor, self.actor_setup).items()}
        if self.ref_setup is not None:
            out.update({f"ref {k}": v for k, v in resident_bytes(self.actor, self.ref_setup).items()})
        if self.critic_setup is not None:
            out.update({f"critic {k}": v for k, v in resident_bytes(self.critic, self.critic_setup).items()})
        return out

    def _engine_outside_gen(self, device_bytes: int) -> dict[str, int]:
        rollout = self.c.actor_rollout_ref.rollout
        if rollout.free_cache_engine or not self.c.actor_rollout_ref.hybrid_engine:
            return {}
        return {"rollout engine": int(rollout.gpu_memory_utilization * device_bytes)}

    def _phase(self, name: str, device_bytes: int, parts: dict[str, int]) -> PhaseEstimate:
        return PhaseEstimate(name, {**self.resident(), **self._engine_outside_gen(device_bytes), **parts})

    def knobs(self, device_bytes: int) -> list[Knob]:
        """One knob per phase, in step order."""
        c, arr = self.c, self.c.actor_rollout_ref
        rollout, actor = arr.rollout, arr.actor

        def gen(util: float) -> PhaseEstimate:
            # hybrid_engine=false: the engine has devices of its own (its share of them always fits)
            engine = {"rollout engine": int(util * device_bytes)} if arr.hybrid_engine else {}
            return PhaseEstimate("gen", {**self.resident(), **engine})

        def fwd(name: str, shape: ModelShape, s: TrainSetup, dynamic: bool):
            def est(micro: float) -> PhaseEstimate:
                setup, rows = _rows(s, int(micro), dynamic, int(micro))
                parts = forward_bytes(shape, rows, setup.tokens_per_row, setup.logit_rows_per_row, s.gathered_pass,
                                      s.float32_chunks, s.unit_params, s.chunk_tokens)
                return self._phase(name, device_bytes, {**onloaded_bytes(shape, s, False), **parts})
            return est

        def upd(name: str, shape: ModelShape, s: TrainSetup, dynamic: bool):
            def est(micro: float) -> PhaseEstimate:
                setup, rows = _rows(s, int(micro), dynamic, int(micro))
                return self._phase(name, device_bytes, update_bytes(shape, setup, rows))
            return est

        def knob(group: str, micro_key: str, micro, dynamic: bool, tokens_key: str, tokens: int, make) -> Knob:
            if dynamic:
                floor = self.actor_setup.tokens_per_row
                return Knob(f"{group}.{tokens_key}", tokens, make,
                            lambda v: v // 2 if v // 2 >= floor else None)
            return Knob(f"{group}.{micro_key}", micro, make, _halve)

        s = self.actor_setup
        out = [Knob(f"{ARR}.rollout.gpu_memory_utilization", rollout.gpu_memory_utilization, gen,
                    lambda u: round(u - 0.05, 2) if u > 0.1 else None),
               knob(f"{ARR}.rollout", "log_prob_micro_batch_size_per_gpu", rollout.log_prob_micro_batch_size_per_gpu,
                    rollout.log_prob_use_dynamic_bsz, "log_prob_max_token_len_per_gpu",
                    rollout.log_prob_max_token_len_per_gpu,
                    # sum p^2 (calculate_sum_pi_squared) goes through the float32 PyTorch chunks, not Triton
                    fwd("old_log_prob", self.actor, replace(s, float32_chunks=s.float32_chunks or bool(
                        actor.calculate_sum_pi_squared)), rollout.log_prob_use_dynamic_bsz))]
        if self.ref_setup is not None:
            ref = arr.ref
            out.append(knob(f"{ARR}.ref", "log_prob_micro_batch_size_per_gpu", ref.log_prob_micro_batch_size_per_gpu,
                            ref.log_prob_use_dynamic_bsz, "log_prob_max_token_len_per_gpu",
                            ref.log_prob_max_token_len_per_gpu,
                            fwd("ref", self.actor, self.ref_setup, ref.log_prob_use_dynamic_bsz)))
        if self.critic_setup is not None:
            cr, cs = c.critic, self.critic_setup
            out.append(knob("critic", "forward_micro_batch_size_per_gpu", cr.forward_micro_batch_size_per_gpu,
                            cr.use_dynamic_bsz, "forward_max_token_len_per_gpu", cr.forward_max_token_len_per_gpu,
                            fwd("values", self.critic, cs, cr.use_dynamic_bsz)))
            out.append(knob("critic", "ppo_micro_batch_size_per_gpu", cr.ppo_micro_batch_size_per_gpu,
                            cr.use_dynamic_bsz, "ppo_max_token_len_per_gpu", cr.ppo_max_token_len_per_gpu,
                            upd("update_critic", self.critic, cs, cr.use_dynamic_bsz)))
        out.append(knob(f"{ARR}.actor", "ppo_micro_batch_size_per_gpu", actor.ppo_micro_batch_size_per_gpu,
                        actor.use_dynamic_bsz, "ppo_max_token_len_per_gpu", actor.ppo_max_token_len_per_gpu,
                        upd("update_actor", self.actor, s, actor.use_dynamic_bsz)))
        return out

    def phases(self, device_bytes: int) -> list[PhaseEstimate]:
        """Every phase at the configured values."""
        return [k.estimate(k.value) for k in self.knobs(device_bytes)]


def run_memory(c: PPOTrainerConfig) -> RunMemory | None:
    """`RunMemory` of `c`, or None when a model folder has no config.json to read the shape from."""
    paths = [c.actor_rollout_ref.model.path] + ([c.critic.model.path] if need_critic(c) else [])
    if not all(os.path.isfile(os.path.join(os.path.expanduser(str(p)), "config.json")) for p in paths):
        return None
    try:
        shapes = [load_shape(str(p)) for p in paths]
    except (KeyError, ValueError):  # not a dense decoder config (a custom architecture, experts)
        return None
    return RunMemory(c, shapes[0], shapes[1] if len(shapes) > 1 else None)


def _fits(est: PhaseEstimate, device_bytes: int) -> bool:
    return est.total + OVERHEAD_BYTES <= device_bytes


def check_memory_fit(mem: RunMemory, device_bytes: int, where: str) -> None:
    """Raise `ConfigError` for the first phase that cannot fit `device_bytes`, with a value that fits.

    Args:
        where: how the device size was found (named in the message).
    """
    for knob in mem.knobs(device_bytes):
        est = knob.estimate(knob.value)
        if _fits(est, device_bytes):
            continue
        value = knob.smaller(knob.value)
        while value is not None and not _fits(knob.estimate(value), device_bytes):
            value = knob.smaller(value)
        fix = f"{knob.key}={value:g}" if value is not None else _other_fix(mem, est.phase)
        raise ConfigError(
            f"memory: phase {est.phase} needs an estimated {est.total / GIB:.1f} GiB + {OVERHEAD_BYTES / GIB:.1f} "
            f"GiB overhead per device with {knob.key}={knob.value:g}, more than the {device_bytes / GIB:.1f} GiB "
            f"of the device ({where}); use {fix}. Breakdown:\n{est.line()}")


def _other_fix(mem: RunMemory, phase: str) -> str:
    """No value of the phase's own knob fits: the next lever (checkpointing, then offload)."""
    arr = mem.c.actor_rollout_ref
    if phase == "update_actor" and not arr.model.enable_gradient_checkpointing:
        return f"{ARR}.model.enable_gradient_checkpointing=true"
    if phase == "update_critic" and not mem.c.critic.model.enable_gradient_checkpointing:
        return "critic.model.enable_gradient_checkpointing=true"
    if not arr.actor.fsdp_config.optimizer_offload:
        return f"{ARR}.actor.fsdp_config.optimizer_offload=true"
    if not arr.actor.fsdp_config.param_offload:
        return f"{ARR}.actor.fsdp_config.param_offload=true"
    return "more devices (trainer.n_gpus_per_node) to shard the model over"


def memory_lines(c: PPOTrainerConfig, device_bytes: int | None) -> list[str]:
    """The dry run's estimate: one line per phase (GiB per device), or why there is none."""
    mem = run_memory(c)
    if mem is None:
        return ["memory estimate: none (no config.json in the model folder to read the architecture from)"]
    if device_bytes is None:
        return ["memory estimate: set trainer.device_memory_gb (e.g. 80) to estimate each phase against a device"]
    head = (f"memory estimate per device ({mem.actor.params / 1e9:.2f}B-parameter policy, "
            f"{device_bytes / GIB:.0f} GiB device, {OVERHEAD_BYTES / GIB:.1f} GiB overhead not shown):")
    return [head, *(p.line() for p in mem.phases(device_bytes))]


def check_dry_run_memory(c: PPOTrainerConfig) -> None:
    """The dry run's fit check: against `trainer.device_memory_gb` when set (nothing is measured)."""
    mem = run_memory(c)
    if mem is not None and c.trainer.device_memory_gb is not None:
        check_memory_fit(mem, int(c.trainer.device_memory_gb * GIB), f"trainer.device_memory_gb="
                                                                     f"{c.trainer.device_memory_gb}")
