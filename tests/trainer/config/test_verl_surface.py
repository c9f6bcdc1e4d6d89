"""verl's current key surface: registry-driven choices, honoured keys, aliases, notices, `_target_`."""

import dataclasses
import warnings

import pytest

from rlpost.trainer.config import ConfigError, ConfigWarning, typed_config
from rlpost.trainer.config.choices import (adv_estimators, kl_estimators, loss_agg_modes, policy_losses,
                                           reward_managers, rollout_engines)

ARR = "actor_rollout_ref"


@pytest.mark.parametrize("key, names", [
    ("algorithm.adv_estimator", adv_estimators()),
    (f"{ARR}.actor.policy_loss.loss_mode", policy_losses()),
    (f"{ARR}.actor.kl_loss_type", kl_estimators()),
    ("algorithm.kl_penalty", kl_estimators()),
    (f"{ARR}.actor.loss_agg_mode", loss_agg_modes()),
    (f"{ARR}.rollout.name", rollout_engines()),
    ("reward_model.reward_manager", reward_managers()),
])
def test_every_registered_name_validates(small_cfg, key, names):
    # group estimators need n > 1; gae needs a critic whose micro-batch divides its mini-batch
    group = {"algorithm.adv_estimator": "grpo", f"{ARR}.rollout.n": 2, "critic.ppo_micro_batch_size_per_gpu": 2}
    for name in names:
        extra = {"trainer.device": "cuda"} if name == "sglang" else {}
        if name == "gdpo":  # normalises the reward components it is given
            extra = {"algorithm.gdpo_reward_keys": ["acc"]}
        if name in ("optimal_token_baseline", "tir_optimal_token_baseline"):  # weighs tokens by sum p^2
            extra = {"actor_rollout_ref.actor.calculate_sum_pi_squared": True}
        if name == "codapo":  # reads the dapo manager's 'acc'
            extra = {"reward_model.reward_manager": "dapo"}
        if name == "dro":  # weighs its log-ratio penalty by dro_beta
            extra = {f"{ARR}.actor.policy_loss.dro_beta": 0.05}
        if name == "bypass_mode":  # the old policy is the rollout's log-probs
            extra = {"algorithm.rollout_correction.bypass_mode": True, f"{ARR}.rollout.calculate_log_probs": True}
        typed = typed_config(small_cfg({**group, **extra, key: name}))
        node = typed
        for part in key.split("."):
            node = getattr(node, part)
        assert node == name


def test_verl_names_are_registered():
    assert {"gspo", "gpg", "clip_cov", "kl_cov", "geo_mean", "cispo", "sapo", "topr", "vanilla"} <= set(policy_losses())
    assert {"grpo_passk", "rloo_vectorized", "grpo_vectorized", "grpo", "gae"} <= set(adv_estimators())
    assert {"low_var_kl+", "k1", "k2", "k3", "k3+"} <= set(kl_estimators())
    assert "seq-mean-token-sum-norm" in loss_agg_modes()


def test_user_registered_estimator_validates(small_cfg):
    from rlpost.algos.advantages import ADV_ESTIMATORS, register_adv_est

    @register_adv_est("my_test_estimator")
    def _mine(**kwargs):
        raise AssertionError("not called by validation")

    try:
        cfg = small_cfg({"algorithm.adv_estimator": "my_test_estimator"})
        assert typed_config(cfg).algorithm.adv_estimator == "my_test_estimator"
    finally:
        ADV_ESTIMATORS._entries.pop("my_test_estimator")


def test_unknown_loss_mode_names_the_nearest(small_cfg):
    with pytest.raises(ConfigError, match="policy_loss.loss_mode=gspo"):
        typed_config(small_cfg({f"{ARR}.actor.policy_loss.loss_mode": "gpso"}))


def test_clip_ratio_sets_both_bounds_unless_they_are_set(compose_fn):
    typed = typed_config(compose_fn(overrides=(f"{ARR}.actor.clip_ratio=0.3",)))
    assert (typed.actor_rollout_ref.actor.clip_ratio_low, typed.actor_rollout_ref.actor.clip_ratio_high) == (0.3, 0.3)
    typed = typed_config(compose_fn(overrides=(f"{ARR}.actor.clip_ratio=0.3", f"{ARR}.actor.clip_ratio_high=0.28")))
    assert (typed.actor_rollout_ref.actor.clip_ratio_low, typed.actor_rollout_ref.actor.clip_ratio_high) == (0.3, 0.28)


def test_typed_config_is_frozen_and_reads_like_a_dict(small_cfg):
    actor = typed_config(small_cfg()).actor_rollout_ref.actor
    assert actor.get("clip_ratio") == actor["clip_ratio"] == 0.2 and "policy_loss" in actor
    assert actor.get("no_such_key", 7) == 7 and actor.select("policy_loss.loss_mode") == "vanilla"
    with pytest.raises(dataclasses.FrozenInstanceError):
        actor.clip_ratio = 0.5  # frozen: keys are never rewritten in place
    with pytest.raises(KeyError, match="no key 'clip_ratoi'"):
        actor["clip_ratoi"]


@pytest.mark.parametrize("old, value, new, expected", [
    (f"{ARR}.rollout.multi_turn.max_turns", 5, f"{ARR}.rollout.multi_turn.max_assistant_turns", 5),
    (f"{ARR}.rollout.multi_turn.enable_tokenization_sanity_check", False,
     f"{ARR}.rollout.multi_turn.tokenization_sanity_check_mode", "disable"),
    (f"{ARR}.actor.tis_imp_ratio_cap", 2.5, "algorithm.rollout_correction.rollout_is_threshold", 2.5),
    ("reward_model.micro_batch_size", 8, "reward_model.micro_batch_size_per_gpu", 4),
    ("critic.forward_micro_batch_size", 8, "critic.forward_micro_batch_size_per_gpu", 4),
])
def test_deprecated_keys_map_with_a_warning(small_cfg, old, value, new, expected):
    values = {old: value}
    if "tis_imp" in old:
        values[f"{ARR}.rollout.calculate_log_probs"] = True
    cfg = small_cfg(values)
    with pytest.warns(ConfigWarning, match="deprecated"):
        typed = typed_config(cfg)
    assert typed.select(new) == expected


def test_moved_multi_turn_paths_are_checked_under_their_new_name(small_cfg):
    cfg = small_cfg({f"{ARR}.rollout.tool_kwargs.tools_config_file": "/tools.yaml"})
    with pytest.warns(ConfigWarning, match="tool_config_path"), pytest.raises(ConfigError) as err:
        typed_config(cfg)
    assert str(err.value).startswith(f"{ARR}.rollout.multi_turn.tool_config_path=/tools.yaml, "
                                     f"{ARR}.rollout.multi_turn.enable=false: agent loops, tools and interactions "
                                     "run only in multi-turn rollouts; use")


@pytest.mark.parametrize("synonym, value, key", [
    (f"{ARR}.actor.optim.clip_grad", 0.5, f"{ARR}.actor.grad_clip"),
    ("ray_kwargs.ray_init.num_cpus", 3, "ray_init.num_cpus"),
    ("data.shuffle", False, "data.train_shuffle"),                    # both names are current (verl / seeds)
    ("data.validation_shuffle", True, "data.val_shuffle"),
    (f"{ARR}.model.external_lib", "my_pkg", f"{ARR}.model.external_libs"),
    (f"{ARR}.actor.use_remove_padding", True, f"{ARR}.model.use_remove_padding"),
    (f"{ARR}.rollout.checkpoint_engine.update_weights_bucket_megabytes", 2048,  # verl's newer spelling
     f"{ARR}.rollout.update_weights_bucket_megabytes"),
    # verl's newer `reward` group and the transitional reward_model spellings
    ("reward.reward_model.enable", True, "reward_model.enable"),
    ("reward.reward_model.model_path", "/models/rm", "reward_model.model.path"),
    ("reward_model.model_path", "/models/rm", "reward_model.model.path"),
    ("reward.reward_manager.name", "prime", "reward_model.reward_manager"),
    ("reward.custom_reward_function.path", "/code/reward.py", "custom_reward_function.path"),
    ("reward.custom_reward_function.name", "my_score", "custom_reward_function.name"),
    ("reward.num_workers", 4, "reward_model.num_workers"),
    ("reward.sandbox_fusion.max_concurrent", 8, "reward_model.sandbox_fusion.max_concurrent"),
    ("critic.fsdp.param_offload", True, "critic.model.fsdp_config.param_offload"),  # verl's engine-level spelling
])
def test_synonyms_set_the_key(small_cfg, synonym, value, key):
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConfigWarning)  # no deprecation warning for either name
        typed = typed_config(small_cfg({synonym: value}))
    assert typed.select(key) == value and typed.select(synonym) == value


def test_notice_for_accepted_no_effect_keys(small_cfg):
    with pytest.warns(ConfigWarning, match="layered_summon=true accepted: the weight sync gathers one bucket"):
        typed_config(small_cfg({f"{ARR}.rollout.layered_summon": True}))
    with pytest.warns(ConfigWarning, match="reward_model.model.use_fused_kernels=true accepted: .* nothing to fuse"):
        typed_config(small_cfg({"reward_model.model.use_fused_kernels": True}))


def test_reward_loop_is_accepted_with_a_notice_unless_a_function_queries_the_model(small_cfg):
    """verl's reward loop computes the same scores as rlpost's reward path for rule-based rewards and for a
    discriminative reward model (a notice); with a custom function beside an enabled reward model, the model is a
    generative judge the function queries (tests/reward/test_judge.py), served by vLLM on its own pool."""
    with pytest.warns(ConfigWarning, match="use_reward_loop=true accepted: rule-based scores come from"):
        typed_config(small_cfg({"reward_model.use_reward_loop": True}))
    genrm = {"reward_model.use_reward_loop": True, "reward_model.enable": True, "reward_model.model.path": "/m",
             "custom_reward_function.path": "/r.py"}
    with pytest.raises(ConfigError, match="^reward_model.rollout.name=null with a generative reward model: .*use "
                                          "reward_model.rollout.name=vllm"):
        typed_config(small_cfg(genrm))
    served = {**genrm, "reward_model.rollout.name": "vllm", "reward_model.enable_resource_pool": True,
              "reward_model.nnodes": 1, "reward_model.n_gpus_per_node": 1}
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", ConfigWarning)  # the judge reads these keys: no "not used" notice
        typed = typed_config(small_cfg(served))
    assert typed.reward_model.rollout.name == "vllm"


def test_hydra_target_markers_are_accepted(small_cfg):
    cfg = small_cfg({f"{ARR}.actor._target_": "verl.workers.config.FSDPActorConfig",
                     "algorithm._target_": "verl.trainer.config.AlgoConfig"})
    assert typed_config(cfg).actor_rollout_ref.actor.strategy == "fsdp2"


def test_reward_loop_engine_keys_are_noticed_and_scorer_kwargs_refused(small_cfg):
    """verl's reward-loop engine settings have nothing to set in rlpost's FSDP reward model (one notice naming what
    was set); built-in scorer kwargs go to the built-in scorers only (a manager class of the user's own is built:
    tests/reward/test_verl_reward_managers.py)."""
    with pytest.warns(ConfigWarning) as caught:
        typed = typed_config(small_cfg({"reward.reward_model.rollout.name": "vllm",
                                        "reward.reward_model.rollout.max_num_seqs": 8,
                                        "reward_model.inference.gpu_memory_utilization": 0.8}))
    assert typed.reward_model.rollout.name == "vllm" and typed.reward_model.rollout.gpu_memory_utilization == 0.8
    lines = [str(w.message) for w in caught]
    assert any(m.startswith("reward.reward_model.rollout={") and "'max_num_seqs': 8" in m and " accepted: " in m
               for m in lines), lines
    # the keys rlpost has under reward_model.rollout are noticed there, whichever spelling set them
    assert any(m.startswith("reward_model.rollout={'name': 'vllm', 'gpu_memory_utilization': 0.8}") for m in lines), lines
    # built-in scorer kwargs reach the built-in scorers (tests/reward/test_code_score.py), not a file of the user's
    assert typed_config(small_cfg({"reward.compute_score_kwargs": {"timeout": 3}})).reward.compute_score_kwargs == {
        "timeout": 3}
    with pytest.raises(ConfigError, match="^reward.compute_score_kwargs=.*these keyword arguments go to the "
                                          "built-in scorers only; use custom_reward_function.reward_kwargs"):
        typed_config(small_cfg({"reward.compute_score_kwargs": {"timeout": 3}, "custom_reward_function.path": "/f.py"}))
    with pytest.raises(ConfigError, match="two spellings of one setting and disagree"):
        typed_config(small_cfg({"reward.reward_model.model_path": "/a", "reward_model.model.path": "/b"}))


def test_a_refusal_names_the_spelling_the_user_set(small_cfg):
    """`critic.fsdp.use_torch_compile` is verl's newer spelling of `critic.model.fsdp_config.use_torch_compile`
    (not built): the message and its fix name the key the user wrote, not the one it was copied onto."""
    with pytest.raises(ConfigError) as err:
        typed_config(small_cfg({"critic.fsdp.use_torch_compile": True}))
    assert str(err.value).startswith("not supported yet: critic.fsdp.use_torch_compile=true (")
    assert str(err.value).endswith("use critic.fsdp.use_torch_compile=false.")
    with pytest.raises(ConfigError, match="^not supported yet: reward_model.enable_resource_pool=true without a "
                                          "generative reward model: .*use reward_model.enable_resource_pool=false"):
        typed_config(small_cfg({"reward.reward_model.enable_resource_pool": True}))


def test_sandbox_url_is_a_run_code_url_or_local(small_cfg):
    """verl's sandbox keys in either spelling are taken; a value that is neither a URL nor `local` is refused."""
    typed = typed_config(small_cfg({"reward.sandbox_fusion.url": "http://sandbox:8080/run_code",
                                    "reward.sandbox_fusion.max_concurrent": 4}))
    assert (typed.reward_model.sandbox_fusion.url, typed.reward_model.sandbox_fusion.max_concurrent) == (
        "http://sandbox:8080/run_code", 4)
    assert typed_config(small_cfg({"reward_model.sandbox_fusion.url": "local"})).reward_model.sandbox_fusion.url == (
        "local")
    with pytest.raises(ConfigError, match="^reward_model.sandbox_fusion.url=sandbox:8080: the code sandbox is a "
                                          "SandboxFusion /run_code URL or local; use reward_model.sandbox_fusion.url="
                                          "local"):
        typed_config(small_cfg({"reward_model.sandbox_fusion.url": "sandbox:8080"}))


def test_two_synonyms_of_one_key(small_cfg):
    """`reward.reward_model.model_path` and `reward_model.model_path` both mean `reward_model.model.path`: set to
    one value they are accepted; set apart, the message names the two spellings the user wrote (the key they map
    to was never set), also when one of them holds the key's default."""
    typed = typed_config(small_cfg({"reward.reward_model.model_path": "/rm", "reward_model.model_path": "/rm"}))
    assert typed.reward_model.model.path == "/rm"
    with pytest.raises(ConfigError, match=r"^reward_model.model_path='/b' and reward.reward_model.model_path='/a' "
                                          r"are two spellings of one setting and disagree"):
        typed_config(small_cfg({"reward.reward_model.model_path": "/a", "reward_model.model_path": "/b"}))
    # the first spelling holds the key's default (0.5): written out by the user, it still disagrees with 0.8
    with pytest.raises(ConfigError, match=r"^reward.reward_model.rollout.gpu_memory_utilization=0.8 and "
                                          r"reward_model.inference.gpu_memory_utilization=0.5 are two spellings"):
        typed_config(small_cfg({"reward_model.inference.gpu_memory_utilization": 0.5,
                                "reward.reward_model.rollout.gpu_memory_utilization": 0.8}))


def test_a_synonym_set_to_an_interpolation_of_the_users_is_copied_resolved(small_cfg):
    """verl's own dp_critic.yaml writes `critic.fsdp.param_offload: ${...actor...param_offload}`: not a default."""
    typed = typed_config(small_cfg({"reward.reward_model.model_path": "${actor_rollout_ref.model.path}",
                                    "actor_rollout_ref.model.path": "/models/policy"}))
    assert typed.reward_model.model.path == "/models/policy"


def test_verl_engine_dtype_and_the_critic_engine_group(small_cfg):
    """verl's `fsdp_config.dtype` (the mixed-precision compute dtype, set in many of its scripts) is copied onto
    `mixed_precision.param_dtype` for the actor, reference and critic; verl's `critic.fsdp.*` engine spellings reach
    `critic.model.fsdp_config.*`; an unset `dtype` keeps rlpost's default (bf16 on GPU, fp32 on CPU)."""
    typed = typed_config(small_cfg({"actor_rollout_ref.actor.fsdp_config.dtype": "float16",
                                    "actor_rollout_ref.ref.fsdp_config.dtype": "bfloat16",
                                    "critic.fsdp.dtype": "bf16", "critic.fsdp.fsdp_size": 2,
                                    "critic.fsdp.wrap_policy.min_num_params": 1000,
                                    "critic.fsdp.reshard_after_forward": False, "critic.fsdp.model_dtype": "bf16"}))
    arr = typed.actor_rollout_ref
    assert arr.actor.fsdp_config.mixed_precision.param_dtype == "float16" == arr.actor.fsdp_config.dtype
    assert arr.ref.fsdp_config.mixed_precision.param_dtype == "bfloat16"
    fsdp = typed.critic.model.fsdp_config
    assert (fsdp.mixed_precision.param_dtype, fsdp.fsdp_size, fsdp.wrap_policy.min_num_params) == ("bf16", 2, 1000)
    assert fsdp.reshard_after_forward is False and fsdp.model_dtype == "bf16"
    assert typed_config(small_cfg({})).actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype is None
    with pytest.raises(ConfigError, match=r"^actor_rollout_ref.actor.fsdp_config.dtype='float16' and "
                                          r"actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype='bf16' "
                                          r"are two spellings"):
        typed_config(small_cfg({"actor_rollout_ref.actor.fsdp_config.dtype": "float16",
                                "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype": "bf16"}))
    same = typed_config(small_cfg({"actor_rollout_ref.actor.fsdp_config.dtype": "bfloat16",  # one dtype, two names
                                   "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype": "bf16"}))
    assert same.actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype == "bfloat16"
    with pytest.raises(ConfigError, match=r"^actor_rollout_ref.actor.fsdp_config.dtype=int8: must be one of null, bf16"):
        typed_config(small_cfg({"actor_rollout_ref.actor.fsdp_config.dtype": "int8"}))


def test_verl_engine_determinism_keys(small_cfg):
    """verl's `fsdp_config.full_determinism` and `fsdp_config.seed` exist for every engine, off and 42 by default."""
    typed = typed_config(small_cfg({"actor_rollout_ref.actor.fsdp_config.full_determinism": True,
                                    "actor_rollout_ref.actor.fsdp_config.seed": 1701,
                                    "critic.model.fsdp_config.full_determinism": True}))
    actor, ref = typed.actor_rollout_ref.actor.fsdp_config, typed.actor_rollout_ref.ref.fsdp_config
    assert (actor.full_determinism, actor.seed, ref.full_determinism, ref.seed) == (True, 1701, False, 42)
    assert typed.critic.model.fsdp_config.full_determinism is True


def test_verl_deferred_gradient_sync_key(small_cfg):
    """`use_no_sync_for_gradient_accumulation` (verl's engine key) is off in rlpost unless set; the reference's has
    no effect and says so."""
    assert typed_config(small_cfg({})).actor_rollout_ref.actor.fsdp_config.use_no_sync_for_gradient_accumulation is False
    typed = typed_config(small_cfg({"actor_rollout_ref.actor.fsdp_config.use_no_sync_for_gradient_accumulation": True,
                                    "critic.model.fsdp_config.use_no_sync_for_gradient_accumulation": True}))
    assert typed.actor_rollout_ref.actor.fsdp_config.use_no_sync_for_gradient_accumulation is True
    assert typed.critic.model.fsdp_config.use_no_sync_for_gradient_accumulation is True
    with pytest.warns(ConfigWarning, match="ref.fsdp_config.use_no_sync_for_gradient_accumulation=true accepted: "
                                           "the reference never trains"):
        typed_config(small_cfg({"actor_rollout_ref.ref.fsdp_config.use_no_sync_for_gradient_accumulation": True}))


@pytest.mark.parametrize("key, value, area", [
    ("actor_rollout_ref.actor.fsdp_config.pad_to_length", True, "padding packed micro-batches to a length bucket"),
    ("actor_rollout_ref.ref.fsdp_config.qat.enable", True, "quantization-aware training"),
    ("critic.model.fsdp_config.offload.optimizer.target", "cpu", "per-state offloading"),
    ("critic.fsdp.offload.param.target", "disk", "per-state offloading"),  # verl's critic engine spelling, named
    ("actor_rollout_ref.actor.fsdp_config.strategy", "fsdp_turbo", "verl's fsdp_turbo engine"),
])
def test_verl_engine_features_not_built_are_refused(small_cfg, key, value, area):
    shown = str(value).lower()
    with pytest.raises(ConfigError, match=rf"^not supported yet: {key}={shown} \({area} is not built\); use {key}="):
        typed_config(small_cfg({key: value}))
    # their companion entries are read only with the feature, and compose at verl's defaults
    fsdp = typed_config(small_cfg({})).actor_rollout_ref.actor.fsdp_config
    assert (fsdp.pad_to_length_bucket, fsdp.qat.mode, fsdp.offload.disk.chunk_size_mb) == (1024, "w4a16", 64)


def test_engine_strategy_is_checked(small_cfg):
    """`fsdp_config.strategy` takes fsdp or fsdp2 (both run FSDP2); a typo is an error naming the values."""
    assert typed_config(small_cfg({"critic.model.fsdp_config.strategy": "fsdp"})).critic.model.fsdp_config.strategy == "fsdp"
    with pytest.raises(ConfigError, match=r"^actor_rollout_ref.ref.fsdp_config.strategy=fsdp3: must be one of fsdp2, fsdp"):
        typed_config(small_cfg({"actor_rollout_ref.ref.fsdp_config.strategy": "fsdp3"}))


@pytest.mark.parametrize("group", sorted(__import__("rlpost.trainer.config.unsupported",
                                                    fromlist=["UNBUILT_GROUPS"]).UNBUILT_GROUPS))
def test_unbuilt_groups_compose_at_verl_defaults_and_refuse_any_change(small_cfg, group):
    """verl's groups for features not built compose with verl's defaults; a change to any leaf is refused by
    name, the leaf and the value to use named."""
    from omegaconf import OmegaConf

    from rlpost.trainer.config.defaults import package_defaults

    def leaves(node, prefix):
        if isinstance(node, dict):
            for k, v in node.items():
                yield from leaves(v, f"{prefix}.{k}")
        else:
            yield prefix, node

    tree = OmegaConf.to_container(OmegaConf.select(package_defaults(), group), resolve=False)
    key, default = next((k, v) for k, v in leaves(tree, group) if not (isinstance(v, str) and "${" in v))
    changed = (not default) if isinstance(default, bool) else (
        default + 1 if isinstance(default, (int, float)) else [1] if isinstance(default, list) else "changed")
    typed_config(small_cfg({}))  # the defaults themselves pass
    with pytest.raises(ConfigError, match=rf"not supported yet: {key}=.* is not built\); use {key}="):
        typed_config(small_cfg({key: changed}))


@pytest.mark.parametrize("key, value", [
    ("actor_rollout_ref.actor.use_prefix_grouper", True),
    ("actor_rollout_ref.rollout.logprobs_mode", "raw_logprobs"), ("actor_rollout_ref.rollout.scheduling_policy",
                                                                 "priority"),
    ("actor_rollout_ref.actor.checkpoint.strict", False), ("critic.model.use_liger", True),
    ("ray_kwargs.ray_init.runtime_env.py_executable", "/usr/bin/python3"),
])
def test_newer_verl_keys_refused_by_name(small_cfg, key, value):
    with pytest.raises(ConfigError, match=f"not supported yet: {key}="):
        typed_config(small_cfg({key: value}))


def test_newer_verl_synonyms_and_accepted_keys(small_cfg):
    with pytest.warns(ConfigWarning, match="trainer.use_v1=false accepted"):
        typed = typed_config(small_cfg({"trainer.use_v1": False, "critic.fsdp.seed": 7,
                                        "actor_rollout_ref.actor.calculate_entropy": True,
                                        "actor_rollout_ref.rollout.seed": 5}))
    assert typed.critic.model.fsdp_config.seed == 7 and typed.actor_rollout_ref.rollout.seed == 5
    with pytest.raises(ConfigError, match="not supported yet: actor_rollout_ref.actor.pad_to_length=true"):
        typed_config(small_cfg({"actor_rollout_ref.actor.pad_to_length": True}))


def test_rollout_seed_is_refused_on_the_hf_engine_and_interpolated_defaults_say_remove(small_cfg):
    with pytest.raises(ConfigError, match="not supported yet: actor_rollout_ref.rollout.seed=3 with "
                                          "actor_rollout_ref.rollout.name=hf"):
        typed_config(small_cfg({"actor_rollout_ref.rollout.name": "hf", "actor_rollout_ref.rollout.seed": 3}))
    # a leaf of an unbuilt group that follows another key: changing that other key is not a change of the leaf
    typed_config(small_cfg({"actor_rollout_ref.rollout.name": "hf", "trainer.project_name": "p"}))
    with pytest.raises(ConfigError, match="prometheus.served_model_name=m .*; remove the override of "
                                          "actor_rollout_ref.rollout.prometheus.served_model_name"):
        typed_config(small_cfg({"actor_rollout_ref.rollout.prometheus.served_model_name": "m"}))


def test_gdpo_needs_its_reward_components(small_cfg):
    gdpo = {"algorithm.adv_estimator": "gdpo", "actor_rollout_ref.rollout.n": 2}
    with pytest.raises(ConfigError, match="algorithm.adv_estimator=gdpo, algorithm.gdpo_reward_keys=None"):
        typed_config(small_cfg(gdpo))
    with pytest.raises(ConfigError, match=r"gdpo_reward_weights=\[1.0\]: gdpo normalises"):
        typed_config(small_cfg({**gdpo, "algorithm.gdpo_reward_keys": ["acc", "fmt"],
                                "algorithm.gdpo_reward_weights": [1.0]}))
    typed = typed_config(small_cfg({**gdpo, "algorithm.gdpo_reward_keys": ["acc", "fmt"],
                                    "reward.reward_manager.name": "gdpo"}))
    assert typed.algorithm.gdpo_reward_keys == ["acc", "fmt"] and typed.reward_model.reward_manager == "gdpo"


@pytest.mark.parametrize("override, message", [
    ({"algorithm.codapo_top_k": 0}, r"algorithm.codapo_top_k=0, data.train_batch_size=\d+: the focused step repeats"),
    ({"algorithm.codapo_weight_offset": -0.5}, "algorithm.codapo_weight_offset=-0.5: the floor"),
    ({"algorithm.filter_groups.enable": True}, "algorithm.adv_estimator=codapo, algorithm.filter_groups.enable=true"),
    ({"reward_model.reward_manager": "naive"}, "reward_manager.name=naive, custom_reward_function.path=null: the "
                                               "built-in scorers return plain numbers, so no 'acc'"),
])
def test_codapo_rules(small_cfg, override, message):
    codapo = {"algorithm.adv_estimator": "codapo", "actor_rollout_ref.rollout.n": 2, "reward_model.reward_manager": "dapo"}
    assert typed_config(small_cfg(codapo)).algorithm.codapo_top_k is None  # null: verl's default 4 at run time
    with pytest.raises(ConfigError, match=message):
        typed_config(small_cfg({**codapo, **override}))
    with pytest.warns(ConfigWarning, match="algorithm.codapo_top_k are read only with algorithm.adv_estimator=codapo"):
        typed_config(small_cfg({"algorithm.codapo_top_k": 4}))


@pytest.mark.parametrize("override, message", [
    ({"actor_rollout_ref.actor.calculate_sum_pi_squared": False},
     "optimal_token_baseline, actor_rollout_ref.actor.calculate_sum_pi_squared=false: .*; use .*=true"),
    ({"algorithm.rollout_correction.bypass_mode": True}, "bypass_mode=true: bypass mode takes the engine's log-probs"),
    ({"actor_rollout_ref.model.use_fused_kernels": True}, "use_fused_kernels=true: the fused LM head returns"),
])
def test_optimal_token_baseline_rules(small_cfg, override, message):
    otb = {"algorithm.adv_estimator": "optimal_token_baseline", "actor_rollout_ref.rollout.n": 2,
           "actor_rollout_ref.actor.calculate_sum_pi_squared": True}
    assert typed_config(small_cfg(otb)).actor_rollout_ref.actor.calculate_sum_pi_squared is True
    with pytest.raises(ConfigError, match=message):
        typed_config(small_cfg({**otb, **override}))
