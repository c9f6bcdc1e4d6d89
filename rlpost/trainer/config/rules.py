"""Value and combination rules checked at start-up on the typed config.

Each rule raises one `ConfigError` whose message names the key(s), the value(s), the rule, and a
valid value to use; legal but suspicious combinations only warn.
"""

import difflib
import json
import os
from collections.abc import Mapping
from typing import Any

from rlpost.algos.advantages import estimator_needs
from rlpost.config.constraints import check_fields
from rlpost.trainer.config.choices import enums
from rlpost.trainer.config.errors import ConfigError, warn
from rlpost.trainer.config.roles import need_critic, need_reference_policy, need_reward_model
from rlpost.config.schema import PPOTrainerConfig
from rlpost.engine.liger import LIGER_REQUIREMENT, liger_model_types
from rlpost.utils.lora_config import lora_enabled

ARR = "actor_rollout_ref"

def get(c: Any, key: str) -> Any:
    """Value of a dotted key on the typed config (or a DictConfig)."""
    for part in key.split("."):
        c = getattr(c, part)
    return c


def fail(keys: str, rule: str, fix: str) -> None:
    """Raise the one-message `ConfigError`: '<keys>: <rule>; use <fix>.'"""
    raise ConfigError(f"{keys}: {rule}; use {fix}.")


def show(value: Any) -> str:
    """A value as it is written on the command line."""
    if value is None:
        return "null"
    return str(value).lower() if isinstance(value, bool) else str(value)


def check_enums(c: PPOTrainerConfig, spelled: Mapping[str, str] | None = None) -> None:
    """Every enumerated key holds one of its values (lists: every entry). `spelled` maps a key to the synonym
    the user set it through (`apply_aliases`): the message names that spelling."""
    for key, allowed in enums().items():
        value = get(c, key)
        key = (spelled or {}).get(key, key)
        for item in value if isinstance(value, list) else [value]:
            if item not in allowed:
                names = [show(a) for a in allowed]
                near = difflib.get_close_matches(str(item), names, n=1, cutoff=0.0)[0]
                shown = f"{key}={show(value)}" + (f" (entry {item!r})" if isinstance(value, list) else "")
                fixed = [near if v == item else v for v in value] if isinstance(value, list) else near
                fix = f"{key}={fixed}"
                fail(shown, f"must be one of {', '.join(names)}", fix)


def check_ranges(c: PPOTrainerConfig) -> None:
    """Every value inside the constraint its schema field declares (sizes positive, coefficients
    non-negative, fractions inside their interval, ...); then the free-form engine map's one bounded value."""
    check_fields(c, ConfigError)
    policy_loss = c.actor_rollout_ref.actor.policy_loss
    if policy_loss.loss_mode == "dro" and (policy_loss.dro_beta is None or policy_loss.dro_beta < 0):
        key = f"{ARR}.actor.policy_loss.dro_beta"
        fail(f"{key}={show(policy_loss.dro_beta)} with policy_loss.loss_mode=dro",
             "the DRO loss needs its penalty weight >= 0", f"{key}=0.05")
    mem = c.actor_rollout_ref.rollout.engine_kwargs.sglang.get("mem_fraction_static")
    if mem is not None and not (isinstance(mem, (int, float)) and 0 < mem <= 1):
        key = f"{ARR}.rollout.engine_kwargs.sglang.mem_fraction_static"
        fail(f"{key}={mem}", "must be in (0, 1] or null", f"{key}=0.8")


def groups_metric_after_kl(algo) -> bool:
    """True when dynamic sampling asks for the KL-penalised reward, which does not exist yet at filter time."""
    return algo.filter_groups.enable and algo.filter_groups.metric == "seq_final_reward" and algo.use_kl_in_reward


def check_combinations(c: PPOTrainerConfig) -> None:
    """Cross-key rules: estimator vs rollout.n, validation sampling, KL placement, engine vs device."""
    algo, rollout = c.algorithm, c.actor_rollout_ref.rollout
    teacher_only = c.distillation.enabled and not c.distillation.distillation_loss.use_task_rewards
    if estimator_needs(algo.adv_estimator).groups and rollout.n == 1 and not teacher_only:
        # verl runs these (a group of one: GRPO keeps the score as the advantage, RLOO gives 0), so a warning
        warn(f"algorithm.adv_estimator={algo.adv_estimator} with {ARR}.rollout.n=1: {algo.adv_estimator} compares "
             "the responses of one prompt, and each group holds one, so the advantages carry no comparison; "
             f"set {ARR}.rollout.n=4 (or algorithm.adv_estimator=gae)")
    actor = c.actor_rollout_ref.actor
    if estimator_needs(algo.adv_estimator).sum_pi_squared and not actor.calculate_sum_pi_squared:
        fail(f"algorithm.adv_estimator={algo.adv_estimator}, {ARR}.actor.calculate_sum_pi_squared=false",
             "the optimal token baseline weighs each token by the actor's sum over the vocabulary of p^2",
             f"{ARR}.actor.calculate_sum_pi_squared=true")
    if estimator_needs(algo.adv_estimator).sum_pi_squared and algo.rollout_correction.bypass_mode:
        fail(f"algorithm.adv_estimator={algo.adv_estimator}, algorithm.rollout_correction.bypass_mode=true",
             "bypass mode takes the engine's log-probs instead of the actor's pass, which computes sum p^2",
             "algorithm.rollout_correction.bypass_mode=false")
    if actor.calculate_sum_pi_squared and c.actor_rollout_ref.model.use_fused_kernels:
        fail(f"{ARR}.actor.calculate_sum_pi_squared=true, {ARR}.model.use_fused_kernels=true",
             "the fused LM head returns log-probs and entropies only; sum p^2 needs the logits",
             f"{ARR}.model.use_fused_kernels=false")
    val = rollout.val_kwargs
    if val.do_sample and val.temperature == 0:
        fail(f"{ARR}.rollout.val_kwargs.do_sample=true, {ARR}.rollout.val_kwargs.temperature=0",
             "sampling at temperature 0 is undefined", f"{ARR}.rollout.val_kwargs.do_sample=false "
             f"(greedy) or {ARR}.rollout.val_kwargs.temperature=1.0")
    if algo.use_kl_in_reward and c.actor_rollout_ref.actor.use_kl_loss:
        warn(f"algorithm.use_kl_in_reward=true and {ARR}.actor.use_kl_loss=true: double KL penalty "
             f"(reward and loss); usually keep one, e.g. {ARR}.actor.use_kl_loss=false.")
    if rollout.skip_rollout:
        _check_rollout_skip(c)
    actor = c.actor_rollout_ref.actor
    if actor.loss_scale_factor is not None and actor.loss_agg_mode != "seq-mean-token-sum-norm":
        warn(f"{ARR}.actor.loss_scale_factor={actor.loss_scale_factor} is read only with {ARR}.actor.loss_agg_mode="
             f"seq-mean-token-sum-norm (it is {actor.loss_agg_mode}): it has no effect here.")
    corr = algo.rollout_correction
    veto = corr.rollout_token_veto_threshold
    if (corr.rollout_is or corr.rollout_rs or corr.bypass_mode or veto is not None) and not rollout.calculate_log_probs:
        fail(f"algorithm.rollout_correction (rollout_is={show(corr.rollout_is)}, rollout_rs={show(corr.rollout_rs)}, "
             f"bypass_mode={show(corr.bypass_mode)}, rollout_token_veto_threshold={show(veto)}), "
             f"{ARR}.rollout.calculate_log_probs=false",
             "the correction needs the rollout engine's own log-probs", f"{ARR}.rollout.calculate_log_probs=true")
    if algo.filter_groups.enable and not estimator_needs(algo.adv_estimator).groups:
        fail(f"algorithm.filter_groups.enable=true, algorithm.adv_estimator={algo.adv_estimator}",
             "dynamic sampling filters groups of responses to one prompt; it needs a group estimator",
             "algorithm.adv_estimator=grpo (with rollout.n > 1)")
    if (c.data.gen_batch_size != c.data.train_batch_size and not algo.filter_groups.enable
            and not rollout.over_sample_rate):
        fail(f"data.gen_batch_size={c.data.gen_batch_size}, algorithm.filter_groups.enable=false",
             "generation batches differ from training batches only with dynamic sampling or "
             f"{ARR}.rollout.over_sample_rate > 0",
             "algorithm.filter_groups.enable=true (or remove data.gen_batch_size)")
    try:  # thresholds may be strings ('lower_upper' bands, one per rejection criterion): the algorithm parses them
        from rlpost.algos.rollout_correction import parse_is_threshold, parse_rejection

        from rlpost.algos.rollout_correction import check_lower_and_veto

        upper = parse_is_threshold(corr.rollout_is_threshold)[1]
        criteria = parse_rejection(corr.rollout_rs, corr.rollout_rs_threshold)
        single = corr.rollout_rs is not None and criteria is None  # a single level: its upper bound is a float
        rs_upper = float(corr.rollout_rs_threshold if corr.rollout_rs_threshold is not None else upper) \
            if single else None
        check_lower_and_veto(corr, rs_upper, criteria)
    except ValueError as err:
        raise ConfigError(f"algorithm.{err}") from None
    if c.actor_rollout_ref.actor.policy_loss.loss_mode == "bypass_mode" and not corr.bypass_mode:
        fail(f"{ARR}.actor.policy_loss.loss_mode=bypass_mode, algorithm.rollout_correction.bypass_mode=false",
             "the bypass-mode loss takes the rollout's log-probs as the old policy, which only bypass mode provides",
             "algorithm.rollout_correction.bypass_mode=true (or another loss_mode, e.g. vanilla)")
    if groups_metric_after_kl(algo):
        warn("algorithm.filter_groups.metric=seq_final_reward with algorithm.use_kl_in_reward=true: groups are "
             "filtered before the KL penalty is applied, so the metric equals seq_reward there.")
    if c.data.gen_batch_size < c.data.train_batch_size and algo.filter_groups.enable:
        fail(f"data.gen_batch_size={c.data.gen_batch_size}, data.train_batch_size={c.data.train_batch_size}",
             "a generation batch must hold at least one training batch of prompts",
             f"data.gen_batch_size={c.data.train_batch_size}")
    if rollout.name == "sglang" and c.trainer.device == "cpu":
        fail(f"not supported yet: {ARR}.rollout.name=sglang with trainer.device=cpu",
             "SGLang runs on GPUs only", f"{ARR}.rollout.name=vllm (or hf)")
    if c.reward_model.launch_reward_fn_async and algo.filter_groups.enable:
        fail("reward_model.launch_reward_fn_async=true, algorithm.filter_groups.enable=true",
             "dynamic sampling keeps or drops groups by their scores, so the reward cannot wait until later",
             "reward_model.launch_reward_fn_async=false")
    if rollout.seed is not None and rollout.name == "hf":
        fail(f"not supported yet: {ARR}.rollout.seed={rollout.seed} with {ARR}.rollout.name=hf",
             "the HF engine samples with torch's generator as the trainer seeds it", f"{ARR}.rollout.seed=null")
    check_reward_choices(c)
    check_codapo(c)
    check_sglang(c)
    check_router_replay(c)
    if c.trainer.resume_mode == "resume_path" and not c.trainer.resume_from_path:
        fail("trainer.resume_mode=resume_path, trainer.resume_from_path=null",
             "resume_path needs the checkpoint folder", "trainer.resume_from_path=/abs/ckpt/global_step_N "
             "(or trainer.resume_mode=auto)")


def check_router_replay(c: PPOTrainerConfig) -> None:
    """Router replay (R2) records the experts in the actor's old-log-prob pass and replays them in the update; the
    MoE load metrics (rollout.moe_load_balance_metrics_interval > 0) count what the same pass records."""
    actor = c.actor_rollout_ref.actor
    interval = c.actor_rollout_ref.rollout.moe_load_balance_metrics_interval
    if actor.router_replay.mode == "R2":
        _check_recorded_routing(c, f"{ARR}.actor.router_replay.mode=R2")
    if interval > 0:
        _check_recorded_routing(c, f"{ARR}.rollout.moe_load_balance_metrics_interval={interval}")


def _check_recorded_routing(c: PPOTrainerConfig, key: str) -> None:
    """What recording the routing in the actor's old-log-prob pass needs: a whole packed row and that pass."""
    actor = c.actor_rollout_ref.actor
    if actor.ulysses_sequence_parallel_size > 1:
        fail(f"{key}, {ARR}.actor.ulysses_sequence_parallel_size={actor.ulysses_sequence_parallel_size}",
             "not supported yet: recording the routing on a Ulysses rank's slice of the packed row",
             f"{ARR}.actor.ulysses_sequence_parallel_size=1")
    if c.algorithm.rollout_correction.bypass_mode:
        fail(f"{key}, algorithm.rollout_correction.bypass_mode=true",
             "bypass mode takes the old log-probs from the engine, so no actor pass records the routing",
             "algorithm.rollout_correction.bypass_mode=false")


def _check_rollout_skip(c: PPOTrainerConfig) -> None:
    """What training on one saved batch excludes: another way of building the step's batch."""
    key = f"{ARR}.rollout.skip_rollout=true"
    if c.algorithm.filter_groups.enable:
        fail(f"{key}, algorithm.filter_groups.enable=true", "dynamic sampling generates the step's batch itself",
             "algorithm.filter_groups.enable=false")
    if not c.actor_rollout_ref.hybrid_engine:
        fail(f"{key}, {ARR}.hybrid_engine=false", "split rollouts generate ahead of the step they train",
             f"{ARR}.hybrid_engine=true")
    if c.actor_rollout_ref.rollout.over_sample_rate:
        fail(f"{key}, {ARR}.rollout.over_sample_rate={c.actor_rollout_ref.rollout.over_sample_rate}",
             "over-sampling cuts each generation's unfinished groups", f"{ARR}.rollout.over_sample_rate=0")
    if "codapo" in estimator_needs(c.algorithm.adv_estimator).step_features:
        fail(f"{key}, algorithm.adv_estimator={c.algorithm.adv_estimator}",
             "CoDaPO builds each focused batch from the step before it", "algorithm.adv_estimator=grpo")


def check_codapo(c: PPOTrainerConfig) -> None:
    """CoDaPO's focused batch: its size, and the step order it needs (each focused batch is built from the step
    before it, so nothing may be generated ahead or filtered away)."""
    from rlpost.algos.codapo import codapo_settings

    algo = c.algorithm
    set_keys = [f"algorithm.codapo_{k}" for k in ("top_k", "weight_offset", "accuracy_key")
                if getattr(algo, f"codapo_{k}") is not None]
    if algo.adv_estimator != "codapo":
        if set_keys:
            warn(f"{', '.join(set_keys)} are read only with algorithm.adv_estimator=codapo (it is "
                 f"{algo.adv_estimator}).")
        return
    top_k, offset, key = codapo_settings(algo)
    manager = c.reward_model.reward_manager
    if (c.reward.reward_manager.source == "register" and manager != "dapo" and not c.custom_reward_function.path):
        fail(f"algorithm.adv_estimator=codapo, reward.reward_manager.name={manager}, custom_reward_function.path=null",
             f"the built-in scorers return plain numbers, so no {key!r} (algorithm.codapo_accuracy_key) reaches the "
             "batch; the dapo manager records a plain number as 'acc'", "reward.reward_manager.name=dapo")
    if c.reward_model.enable:
        fail("algorithm.adv_estimator=codapo, reward_model.enable=true",
             f"a reward model's scores carry no {key!r} (algorithm.codapo_accuracy_key) to judge correctness",
             "reward_model.enable=false (a rule-based reward with reward.reward_manager.name=dapo)")
    if not c.actor_rollout_ref.rollout.do_sample:
        fail(f"algorithm.adv_estimator=codapo, {ARR}.rollout.do_sample=false",
             "codapo values a question by how its sampled responses differ", f"{ARR}.rollout.do_sample=true")
    batch = c.data.train_batch_size
    if not 1 <= top_k <= batch:
        fail(f"algorithm.codapo_top_k={top_k}, data.train_batch_size={batch}",
             "the focused step repeats the best codapo_top_k questions of a batch",
             f"algorithm.codapo_top_k={min(4, batch)}")
    if offset < 0:
        fail(f"algorithm.codapo_weight_offset={offset}", "the floor of a question's weight must be >= 0",
             "algorithm.codapo_weight_offset=0.1")
    if algo.filter_groups.enable:
        fail("algorithm.adv_estimator=codapo, algorithm.filter_groups.enable=true",
             "filtering would change the questions between their valuation and the focused step",
             "algorithm.filter_groups.enable=false")
    if c.trainer.staleness > 0:
        fail(f"algorithm.adv_estimator=codapo, trainer.staleness={c.trainer.staleness}",
             "the focused batch is chosen from the step before it, so no generation may run ahead",
             "trainer.staleness=0")


def check_reward_choices(c: PPOTrainerConfig) -> None:
    """gdpo's reward components; where a reward-manager class comes from."""
    algo = c.algorithm
    keys, weights = algo.gdpo_reward_keys, algo.gdpo_reward_weights
    components = estimator_needs(algo.adv_estimator).reward_components
    if components and (not keys or (weights is not None and len(weights) != len(keys))):
        fail(f"algorithm.adv_estimator={algo.adv_estimator}, algorithm.gdpo_reward_keys={keys}, "
             f"algorithm.gdpo_reward_weights={weights}",
             f"{algo.adv_estimator} normalises each named reward component (returned by the reward function beside "
             "'score')",
             "algorithm.gdpo_reward_keys=[accuracy_reward,format_reward] (weights null, or one per key)")
    url = c.reward_model.sandbox_fusion.url
    if url is not None and url != "local" and not str(url).startswith(("http://", "https://")):
        fail(f"reward_model.sandbox_fusion.url={url}", "the code sandbox is a SandboxFusion /run_code URL or local",
             "reward_model.sandbox_fusion.url=local (rlpost starts its sandbox) or http://HOST:PORT/run_code")
    if c.reward.compute_score_kwargs and c.custom_reward_function.path:
        fail(f"reward.compute_score_kwargs={dict(c.reward.compute_score_kwargs)}, custom_reward_function.path="
             f"{c.custom_reward_function.path}", "these keyword arguments go to the built-in scorers only",
             "custom_reward_function.reward_kwargs for your own function")
    manager = c.reward.reward_manager
    if manager.module.path and manager.source != "importlib":
        fail(f"reward.reward_manager.module.path={manager.module.path}, reward.reward_manager.source={manager.source}",
             "the file is read only with source=importlib", "reward.reward_manager.source=importlib")
    if manager.source == "importlib" and not manager.module.path:
        fail("reward.reward_manager.source=importlib, reward.reward_manager.module.path=null",
             "importlib loads the reward manager class from a file of yours",
             "reward.reward_manager.module.path=/abs/path/my_manager.py (and module.name=MyRewardManager)")


def check_sglang(c: PPOTrainerConfig) -> None:
    """SGLang: tensor-parallel blocks within a node; only the engine_kwargs.sglang keys rlpost passes on."""
    rollout = c.actor_rollout_ref.rollout
    tp, per_node = rollout.tensor_model_parallel_size, c.trainer.n_gpus_per_node
    if rollout.name == "sglang" and per_node % tp:
        fix = max(d for d in range(1, tp + 1) if per_node % d == 0)
        fail(f"{ARR}.rollout.tensor_model_parallel_size={tp}, trainer.n_gpus_per_node={per_node}",
             "an SGLang engine starts its tensor-parallel schedulers on the GPUs of one node",
             f"{ARR}.rollout.tensor_model_parallel_size={fix}")
    if rollout.name == "sglang":
        from rlpost.rollout.sglang_args import check_extra_keys

        try:
            check_extra_keys({k: v for k, v in rollout.engine_kwargs.sglang.items() if v is not None})
        except ValueError as err:
            raise ConfigError(str(err)) from err


def lora_key(model: Any) -> str:
    """The key that turns LoRA on, for messages: lora_rank, or lora_adapter_path when only that is set."""
    if model.lora_rank > 0:
        return f"{ARR}.model.lora_rank={model.lora_rank}"
    return f"{ARR}.model.lora_adapter_path={model.lora_adapter_path}"


def check_lora(c: PPOTrainerConfig) -> None:
    """LoRA sizes of the policy and the critic; engines that can take the trained adapter."""
    for group, model in ((f"{ARR}.model", c.actor_rollout_ref.model), ("critic.model", c.critic.model)):
        if model.lora_rank < 0:
            fail(f"{group}.lora_rank={model.lora_rank}", "must be 0 (LoRA off) or a rank >= 1", f"{group}.lora_rank=32")
        if model.lora_alpha <= 0:
            fail(f"{group}.lora_alpha={model.lora_alpha}", "the LoRA scaling must be > 0",
                 f"{group}.lora_alpha={max(2 * model.lora_rank, 16)}")
    arr, rollout = c.actor_rollout_ref, c.actor_rollout_ref.rollout
    sp_actor, sp_ref = arr.actor.ulysses_sequence_parallel_size, arr.ref.ulysses_sequence_parallel_size
    if lora_enabled(arr.model) and need_reference_policy(c) and sp_ref != sp_actor:
        fail(f"{lora_key(arr.model)}, {ARR}.ref.ulysses_sequence_parallel_size={sp_ref}, "
             f"{ARR}.actor.ulysses_sequence_parallel_size={sp_actor}",
             "with LoRA the reference is the actor with its adapters off, so it runs with the actor's layout",
             f"{ARR}.ref.ulysses_sequence_parallel_size={sp_actor}")
    if lora_enabled(arr.model) and rollout.name == "sglang":
        fail(f"not supported yet: {lora_key(arr.model)} with {ARR}.rollout.name=sglang",
             "LoRA weights reach the vLLM and HF engines only",
             f"{ARR}.rollout.name=vllm")


# Engines with a multi-turn (agent loop) front: `BaseRollout.agent_engine`.
MULTI_TURN_ENGINES = ("vllm", "sglang", "hf")
# ... and with tensor parallelism (`BaseRollout.agent_tp_mode`, `AgentRollout.generate_in_block`)
MULTI_TURN_TP_ENGINES = ("vllm", "sglang")


def check_multi_turn(c: PPOTrainerConfig) -> None:
    """Multi-turn rollouts: an engine with an agent-loop front, raw chat messages in the batch, and no
    multi-turn file set while multi-turn is off (it would do nothing)."""
    rollout = c.actor_rollout_ref.rollout
    mt, agent = rollout.multi_turn, rollout.agent
    _check_tool_shaping(c)
    if not mt.enable:
        for key, value in (("multi_turn.tool_config_path", mt.tool_config_path),
                           ("multi_turn.interaction_config_path", mt.interaction_config_path),
                           ("agent.agent_loop_config_path", agent.agent_loop_config_path),
                           ("agent.default_agent_loop", agent.default_agent_loop)):
            if value is not None:
                fail(f"{ARR}.rollout.{key}={value}, {ARR}.rollout.multi_turn.enable=false",
                     "agent loops, tools and interactions run only in multi-turn rollouts",
                     f"{ARR}.rollout.multi_turn.enable=true")
        return
    if rollout.name not in MULTI_TURN_ENGINES:
        fail(f"not supported yet: {ARR}.rollout.name={rollout.name} with {ARR}.rollout.multi_turn.enable=true",
             f"multi-turn rollouts run on the {' or '.join(MULTI_TURN_ENGINES)} engine", f"{ARR}.rollout.name=vllm")
    if rollout.tensor_model_parallel_size != 1 and rollout.name not in MULTI_TURN_TP_ENGINES:
        # the block's first rank runs the agent loops: vLLM's peers replay its engine calls (lock-step), SGLang's
        # engine runs the block's TP schedulers itself; the HF engine has no tensor-parallel layout
        fail(f"not supported yet: {ARR}.rollout.tensor_model_parallel_size={rollout.tensor_model_parallel_size} "
             f"with {ARR}.rollout.multi_turn.enable=true and {ARR}.rollout.name={rollout.name}",
             f"tensor-parallel agent loops run on the {' or '.join(MULTI_TURN_TP_ENGINES)} engine",
             f"{ARR}.rollout.tensor_model_parallel_size=1 or {ARR}.rollout.name=vllm")
    if not c.data.return_raw_chat:
        fail(f"{ARR}.rollout.multi_turn.enable=true, data.return_raw_chat=false",
             "agent loops render each conversation from the chat messages of the row", "data.return_raw_chat=true")


def _check_tool_shaping(c: PPOTrainerConfig) -> None:
    """The built-in scorer's tool-use kwargs need multi-turn rollouts (tool calls to count) and a bonus size."""
    kwargs = c.custom_reward_function.reward_kwargs
    if c.custom_reward_function.path is not None:
        return  # a user function receives its kwargs as they are
    use, bonus, penalty = (kwargs.get(k) for k in ("use_tool_bonus", "tool_bonus", "multi_tool_penalty"))
    key = "custom_reward_function.reward_kwargs"
    if (use or penalty) and not c.actor_rollout_ref.rollout.multi_turn.enable:
        fail(f"{key}.use_tool_bonus={show(use)}, {key}.multi_tool_penalty={show(penalty)}, "
             f"{ARR}.rollout.multi_turn.enable=false", "tool-use shaping counts the tool calls of multi-turn rollouts",
             f"{ARR}.rollout.multi_turn.enable=true")
    if use and bonus is None:
        fail(f"{key}.use_tool_bonus=true, {key}.tool_bonus=null", "the bonus needs a size", f"{key}.tool_bonus=0.1")
    if bonus is not None and not use:
        fail(f"{key}.tool_bonus={bonus}, {key}.use_tool_bonus={show(use)}", "the bonus is paid only when it is "
             "switched on", f"{key}.use_tool_bonus=true")


def sequence_parallel_roles(c: PPOTrainerConfig) -> list[tuple[str, int, str, bool]]:
    """(role key, Ulysses size, model key, its use_remove_padding) of each role the run creates."""
    arr = c.actor_rollout_ref
    roles = [(f"{ARR}.actor", arr.actor.ulysses_sequence_parallel_size, f"{ARR}.model", arr.model.use_remove_padding)]
    if need_reference_policy(c):
        roles.append((f"{ARR}.ref", arr.ref.ulysses_sequence_parallel_size, f"{ARR}.model",
                      arr.model.use_remove_padding))
    if need_critic(c):
        roles.append(("critic", c.critic.ulysses_sequence_parallel_size, "critic.model",
                      c.critic.model.use_remove_padding))
    if need_reward_model(c):
        roles.append(("reward_model", c.reward_model.ulysses_sequence_parallel_size, "reward_model.model",
                      c.reward_model.model.use_remove_padding))
    return roles


def folder_config(model_path: str) -> dict[str, Any] | None:
    """The model folder's config.json as a dict; None when there is no such file (a hub name: the workers
    check what they need when they load the model)."""
    path = os.path.join(os.path.expanduser(model_path), "config.json")
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return json.load(f)


def attention_heads(model_path: str) -> int | None:
    """`num_attention_heads` from the model folder's config.json (or its text_config); None when the folder or
    the key is not there."""
    config = folder_config(model_path) or {}
    heads = config.get("num_attention_heads") or (config.get("text_config") or {}).get("num_attention_heads")
    return int(heads) if heads else None


def check_sequence_parallel(c: PPOTrainerConfig) -> None:
    """Ulysses sizes: each divides the number of devices and the model's attention heads, and runs on packed
    rows (use_remove_padding=true)."""
    devices = c.trainer.nnodes * c.trainer.n_gpus_per_node
    paths = {f"{ARR}.model": c.actor_rollout_ref.model.path, "critic.model": c.critic.model.path,
             "reward_model.model": c.reward_model.model.path}
    for role, size, model_key, packed in sequence_parallel_roles(c):
        key = f"{role}.ulysses_sequence_parallel_size"
        if size < 1:
            fail(f"{key}={size}", "must be an integer >= 1", f"{key}=1")
        if size == 1:
            continue
        heads = attention_heads(paths[model_key])
        valid = [d for d in range(1, devices + 1) if devices % d == 0 and (heads is None or heads % d == 0)]
        if devices % size:
            fail(f"{key}={size}, trainer.nnodes x trainer.n_gpus_per_node = {devices} devices",
                 "Ulysses groups must tile the devices", f"one of {valid}")
        if heads is not None and heads % size:
            fail(f"{key}={size}, {model_key}.path={paths[model_key]} with {heads} attention heads",
                 "each rank of a Ulysses group attends with an equal share of the heads", f"one of {valid}")
        if not packed:
            fail(f"{key}={size}, {model_key}.use_remove_padding=false",
                 "Ulysses sequence parallelism splits the packed (remove-padding) row",
                 f"{model_key}.use_remove_padding=true")


def check_liger(c: PPOTrainerConfig) -> None:
    """`actor_rollout_ref.model.use_liger=true`: see `check_liger_run`."""
    model = c.actor_rollout_ref.model
    if model.use_liger:
        check_liger_run(f"{ARR}.model.use_liger", c.trainer.device, f"{ARR}.model.path", model.path)


def check_liger_run(key: str, device: str, path_key: str, path: str) -> None:
    """A run with Liger on (the PPO actor's or the SFT trainer's `key`): a CUDA device, liger_kernel importable,
    and a model type Liger patches in the folder `path` (read from its config.json when it is there)."""
    if device != "cuda":
        fail(f"{key}=true, trainer.device={device}", "Liger's kernels are Triton kernels for CUDA GPUs",
             f"{key}=false (or trainer.device=cuda on a GPU machine)")
    try:
        types = liger_model_types()
    except ImportError as err:
        fail(f"{key}=true", f"liger_kernel is not importable ({err})",
             f"`pip install {LIGER_REQUIREMENT}` (or pip install 'rlpost[liger]'), or {key}=false")
    model_type = (folder_config(path) or {}).get("model_type")
    if model_type is not None and model_type not in types:
        fail(f"{key}=true, {path_key}={path} (model_type={model_type})",
             f"Liger patches only the model types {', '.join(types)}", f"{key}=false")
