"""The dry-run plan: what a run would do, computed from the validated config alone (no Ray)."""

import os
from typing import Any

from rlpost.algos.advantages import estimator_needs
from rlpost.trainer.config.batch_rules import n_devices
from rlpost.trainer.config.memory import memory_lines
from rlpost.utils.memory_estimate import GIB
from rlpost.trainer.config.distillation_rules import distillation_plan
from rlpost.trainer.config.judge_rules import judge_plan
from rlpost.trainer.config.placement_rules import split_plan
from rlpost.trainer.config.roles import generative_judge, need_critic, need_reference_policy, need_reward_model
from rlpost.trainer.config.rules import sequence_parallel_roles
from rlpost.config.schema import PPOTrainerConfig
from rlpost.utils.lora_config import lora_enabled, lora_rank_of


def parquet_rows(files: str | list[str] | None) -> int | None:
    """Total row count of the parquet file(s) from their footers, or None when one is missing."""
    if not files:
        return None
    import pyarrow.parquet as pq

    paths = [os.path.expanduser(f) for f in ([files] if isinstance(files, str) else files)]
    if not all(os.path.isfile(p) for p in paths):
        return None
    return sum(pq.ParquetFile(p).metadata.num_rows for p in paths)


def dry_run_plan(c: PPOTrainerConfig) -> str:
    """The resolved plan as text: batches per step and per device, steps, roles, processes."""
    devices, n, train = n_devices(c), c.actor_rollout_ref.rollout.n, c.data.train_batch_size
    lines = ["rlpost dry run: nothing is started", *_processes(c, devices), *_roles(c),
             f"per step: {train} prompts -> {train * n} responses (data.train_batch_size={train} x rollout.n={n}); "
             f"{train * n // devices} responses per device"]
    actor = c.actor_rollout_ref.actor
    lines += _sequence_parallel(c, devices)
    lines += _update_plan("actor", actor.ppo_mini_batch_size, actor.ppo_micro_batch_size_per_gpu,
                          actor.use_dynamic_bsz, actor.ppo_epochs, c, actor.ulysses_sequence_parallel_size)
    if need_critic(c):
        critic = c.critic
        lines += _update_plan("critic", critic.ppo_mini_batch_size, critic.ppo_micro_batch_size_per_gpu,
                              critic.use_dynamic_bsz, critic.ppo_epochs, c, critic.ulysses_sequence_parallel_size)
    lines += _algorithm(c)
    lines += distillation_plan(c)
    lines += judge_plan(c)
    lines += _steps(c)
    lines += memory_lines(c, None if c.trainer.device_memory_gb is None else int(c.trainer.device_memory_gb * GIB))
    return "\n".join(lines)


def _algorithm(c: PPOTrainerConfig) -> list[str]:
    """Loss, KL, off-policy correction and dynamic sampling, as they will run."""
    actor, algo = c.actor_rollout_ref.actor, c.algorithm
    lines = [f"policy loss: {actor.policy_loss.loss_mode}, clip [{actor.clip_ratio_low}, {actor.clip_ratio_high}] "
             f"(dual-clip c={actor.clip_ratio_c}), loss_agg_mode={actor.loss_agg_mode}"]
    if actor.use_kl_loss:
        lines.append(f"KL loss: {actor.kl_loss_type} x {actor.kl_loss_coef}")
    if algo.use_kl_in_reward:
        lines.append(f"KL in reward: {algo.kl_penalty}, {algo.kl_ctrl.type} controller, kl_coef={algo.kl_ctrl.kl_coef}")
    corr = algo.rollout_correction
    veto = corr.rollout_token_veto_threshold
    if corr.rollout_is or corr.rollout_rs or corr.bypass_mode or veto is not None:
        normalised = ", batch-normalised" if corr.rollout_is_batch_normalize else ""
        rejection = corr.rollout_rs or "off"
        if corr.rollout_rs and corr.rollout_rs_threshold is not None:
            rejection += f" ({corr.rollout_rs_threshold})"
        line = (f"rollout correction: importance weights={corr.rollout_is or 'off'} "
                f"(cap {corr.rollout_is_threshold}{normalised}), rejection={rejection}")
        if veto is not None:
            line += f", veto of rows with a token ratio < {veto}"
        if corr.bypass_mode:
            use = ("-w * A * log pi" if corr.loss_type == "reinforce" else
                   f"{actor.policy_loss.loss_mode} clipping; weights unused")
            line += f"; bypass mode: old policy = the rollout's log-probs, loss {corr.loss_type} ({use})"
        lines.append(line)
    own_line = estimator_needs(algo.adv_estimator).plan_line
    if own_line is not None:
        lines.append(own_line(algo))
    groups = algo.filter_groups
    if groups.enable:
        limit = groups.max_num_gen_batches if groups.max_num_gen_batches > 0 else "no limit"
        lines.append(f"dynamic sampling: drop groups with constant {groups.metric}; generation batches of "
                     f"{c.data.gen_batch_size} prompts until {c.data.train_batch_size} groups are kept "
                     f"({limit} batches)")
    return lines


def _processes(c: PPOTrainerConfig, devices: int) -> list[str]:
    kind = "CPU worker processes" if c.trainer.device == "cpu" else "GPUs (one worker process each)"
    rollout = c.actor_rollout_ref.rollout
    lines = [
        f"devices: {devices} {kind} = trainer.nnodes={c.trainer.nnodes} x trainer.n_gpus_per_node="
        f"{c.trainer.n_gpus_per_node} (trainer.device={c.trainer.device})",
        f"rollout: {rollout.name} engine in each actor process, tensor_model_parallel_size="
        f"{rollout.tensor_model_parallel_size}, {devices // rollout.tensor_model_parallel_size} engine(s)",
    ]
    if not c.actor_rollout_ref.hybrid_engine:
        lines[1:2] = split_plan(c)
    mt = rollout.multi_turn
    if mt.enable:
        from rlpost.agent.config import default_agent_loop

        default = default_agent_loop(rollout.agent.default_agent_loop, mt.tool_config_path, mt.interaction_config_path)
        lines.append(f"multi-turn: an agent loop per row (agent_name column, else {default}), tools: "
                     f"{mt.tool_config_path or 'none'}, interactions: {mt.interaction_config_path or 'none'}; "
                     f"{rollout.response_length} response tokens for all turns together")
    return lines


def _roles(c: PPOTrainerConfig) -> list[str]:
    roles = ["actor_rollout"]
    if need_reference_policy(c):
        roles.append("ref")
    if need_critic(c):
        roles.append("critic")
    if need_reward_model(c):
        roles.append("reward_model")
    if c.distillation.enabled:
        roles.append("teacher")
    fn = c.custom_reward_function
    reward = f"{fn.path}:{fn.name}" if fn.path else "built-in scorer per data_source"
    if need_reward_model(c):
        reward = f"reward model {c.reward_model.model.path} (its scores replace the rule scorer's)"
    if generative_judge(c):
        judge = c.reward_model.judge.url or c.reward_model.model.path
        reward = f"generative judge {judge} (its verdicts are the scores)"
    return [f"roles: {', '.join(roles)} (adv_estimator={c.algorithm.adv_estimator})",
            f"reward: {reward} via reward_manager={c.reward_model.reward_manager}", *_lora(c)]


def _lora(c: PPOTrainerConfig) -> list[str]:
    model, lines = c.actor_rollout_ref.model, []
    if lora_enabled(model):
        sync = ("adapter folded into the base, full weights synced" if model.lora.merge
                else "engine loads the base from model.path and serves the adapter; only adapter tensors synced")
        lines.append(f"LoRA: actor trains {_adapters(model)} on a frozen base; rollout: {sync} (model.lora.merge="
                     f"{str(model.lora.merge).lower()})")
        if need_reference_policy(c):
            lines.append("LoRA: reference log-probs = the actor with its adapters disabled (no reference model loaded)")
    if need_critic(c) and lora_enabled(c.critic.model):
        lines.append(f"LoRA: critic trains {_adapters(c.critic.model)} and its value head")
    return lines


def _adapters(model: Any) -> str:
    """"rank-8 adapters (alpha 16, target_modules=all-linear)", or those of the saved adapter it starts from."""
    if model.lora_adapter_path is None:
        return f"rank-{model.lora_rank} adapters (alpha {model.lora_alpha}, target_modules={model.target_modules})"
    rank = lora_rank_of(model)
    return (f"the adapters saved in {model.lora_adapter_path} (" + (f"rank {rank}, " if rank else "")
            + "its own alpha and target modules)")


def _sequence_parallel(c: PPOTrainerConfig, devices: int) -> list[str]:
    """One line naming the Ulysses sizes when a role uses sequence parallelism."""
    roles = sequence_parallel_roles(c)
    if all(size == 1 for _, size, _, _ in roles):
        return []
    sizes = ", ".join(f"{role.split('.')[-1]} {size} ({devices // size} data-parallel groups)"
                      for role, size, _, _ in roles)
    return [f"Ulysses sequence parallelism (devices per group, each running a slice of every packed sequence): "
            f"{sizes}"]


def _update_plan(role: str, mini: int, micro: Any, dynamic: bool, epochs: int, c: PPOTrainerConfig,
                 sp: int) -> list[str]:
    n, train, dp = c.actor_rollout_ref.rollout.n, c.data.train_batch_size, n_devices(c) // sp
    minis = train // mini
    per_rank = mini * n // dp
    where = "per device" if sp == 1 else f"per data-parallel group ({sp} devices share each micro-batch)"
    head = (f"{role}: {minis} mini-batches per step (ppo_mini_batch_size={mini} prompts = {mini * n} responses) "
            f"x ppo_epochs={epochs} = {minis * epochs} optimizer steps per step")
    if dynamic:
        return [head, f"{role} {where}: {per_rank} responses per mini-batch, micro-batches by token count "
                      f"(use_dynamic_bsz=true)"]
    count = per_rank // micro
    return [head, f"{role} {where}: {per_rank} responses per mini-batch = {count} micro-batch"
                  f"{'es' if count != 1 else ''} of {micro} (gradient accumulation {count})"]


def _steps(c: PPOTrainerConfig) -> list[str]:
    epochs, train = c.trainer.total_epochs, c.data.train_batch_size
    rows = parquet_rows(c.data.train_files)
    if c.trainer.total_training_steps is not None:
        return [f"total training steps: {c.trainer.total_training_steps} (trainer.total_training_steps)"]
    if rows is None:
        return [f"total training steps: unknown (data.train_files not found: {c.data.train_files}); "
                f"= rows // {train} x {epochs} epochs"]
    per_epoch = rows // train
    from rlpost.algos.advantages import estimator_needs

    phases = estimator_needs(c.algorithm.adv_estimator).steps_per_batch
    twice = f" x {phases} ({c.algorithm.adv_estimator}: {phases} steps per batch)" if phases > 1 else ""
    return [f"total training steps: {per_epoch * epochs * phases} = {rows} rows // data.train_batch_size={train} "
            f"= {per_epoch} steps per epoch x trainer.total_epochs={epochs}{twice} (before filtering overlong "
            f"prompts)"]
