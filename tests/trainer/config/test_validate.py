"""Each start-up rule fails with one message naming the key, the value and a valid value to use."""

import warnings

import pytest

from rlpost.trainer.config import ConfigError, ConfigWarning, typed_config, validate_config
from rlpost.trainer.config.unsupported import NOT_SUPPORTED_YET

ARR = "actor_rollout_ref"


def test_small_config_is_valid(small_cfg):
    cfg = small_cfg()
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConfigWarning)
        assert validate_config(cfg) is cfg
    typed = typed_config(cfg)
    assert typed.actor_rollout_ref.rollout.n == 4 and typed.trainer.device == "cpu"
    assert isinstance(typed.actor_rollout_ref.actor.optim.lr, float)


def test_default_config_is_valid(make_cfg):
    cfg = validate_config(make_cfg())
    assert cfg.algorithm.adv_estimator == "gae"
    assert dict(cfg.custom_reward_function.reward_kwargs) == {}  # null example kwargs are dropped


RULES = [
    # unknown key (user YAML / +key) with the nearest existing key
    ({f"{ARR}.actor.ppo_mini_batchsize": 4}, [f"unknown key '{ARR}.actor.ppo_mini_batchsize'",
                                              f"did you mean '{ARR}.actor.ppo_mini_batch_size'"]),
    ({"trainer.totl_epochs": 3}, ["unknown key 'trainer.totl_epochs'", "'trainer.total_epochs'"]),
    # types
    ({f"{ARR}.rollout.n": "four"}, [f"{ARR}.rollout.n='four'", "expected int", f"{ARR}.rollout.n=1"]),
    ({"trainer.val_before_train": "yes"}, ["trainer.val_before_train='yes'", "expected bool"]),
    # enumerations
    ({"algorithm.adv_estimator": "grpoo"}, ["algorithm.adv_estimator=grpoo", "algorithm.adv_estimator=grpo"]),
    ({"algorithm.kl_penalty": "low_var"}, ["algorithm.kl_penalty=low_var", "algorithm.kl_penalty=low_var_kl"]),
    ({f"{ARR}.actor.kl_loss_type": "mse2"}, [f"{ARR}.actor.kl_loss_type=mse2", f"{ARR}.actor.kl_loss_type=mse"]),
    ({f"{ARR}.actor.loss_agg_mode": "token_mean"}, ["loss_agg_mode=token_mean", "loss_agg_mode=token-mean"]),
    ({"data.truncation": "lef"}, ["data.truncation=lef", "data.truncation=left"]),
    ({f"{ARR}.rollout.name": "vlm"}, [f"{ARR}.rollout.name=vlm", f"{ARR}.rollout.name=vllm"]),
    ({"trainer.resume_mode": "resume"}, ["trainer.resume_mode=resume", "trainer.resume_mode=resume_path"]),
    ({"trainer.logger": ["console", "tensorbord"]}, ["entry 'tensorbord'", "['console', 'tensorboard']"]),
    ({f"{ARR}.actor.optim.lr_scheduler": "cosin"}, ["lr_scheduler=cosin", "lr_scheduler=cosine"]),
    ({"reward_model.reward_manager": "prim"}, ["reward_model.reward_manager=prim", "reward_model.reward_manager=prime"]),
    ({"trainer.device": "gpu"}, ["trainer.device=gpu", "trainer.device=cpu"]),
    # batch arithmetic
    ({"data.train_batch_size": 7, f"{ARR}.rollout.n": 1, "algorithm.adv_estimator": "gae"},
     ["data.train_batch_size=7", "split evenly over the devices", "use data.train_batch_size=8"]),
    ({f"{ARR}.actor.ppo_mini_batch_size": 16},
     ["ppo_mini_batch_size=16", "mini_batch > train_batch x n", f"use {ARR}.actor.ppo_mini_batch_size=8"]),
    ({f"{ARR}.actor.ppo_mini_batch_size": 3}, ["ppo_mini_batch_size=3", "must divide train_batch_size",
                                               f"use {ARR}.actor.ppo_mini_batch_size=2"]),
    ({f"{ARR}.actor.ppo_micro_batch_size_per_gpu": 3},
     ["ppo_micro_batch_size_per_gpu=3", "mini-batch per data-parallel rank",
      f"use {ARR}.actor.ppo_micro_batch_size_per_gpu=2"]),
    ({f"{ARR}.actor.ppo_micro_batch_size_per_gpu": None}, ["ppo_micro_batch_size_per_gpu=None",
                                                           "use_dynamic_bsz=false"]),
    ({"trainer.n_gpus_per_node": 3}, ["3 devices", "use data.train_batch_size=9"]),
    ({f"{ARR}.rollout.tensor_model_parallel_size": 4, "trainer.device": "cuda"},
     ["tensor_model_parallel_size=4", "tensor_model_parallel_size=2"]),
    ({"algorithm.rollout_correction.rollout_is": "token"}, ["calculate_log_probs=true"]),
    ({"algorithm.filter_groups.enable": True, "algorithm.adv_estimator": "gae"}, ["adv_estimator=grpo"]),
    ({"data.gen_batch_size": 16}, ["data.gen_batch_size=16", "algorithm.filter_groups.enable=true"]),
    ({f"{ARR}.actor.policy_loss.loss_mode": "bypass_mode"},
     [f"{ARR}.actor.policy_loss.loss_mode=bypass_mode", "algorithm.rollout_correction.bypass_mode=true"]),
    ({"algorithm.rollout_correction.rollout_token_veto_threshold": 1e-4},
     ["rollout_token_veto_threshold=0.0001", "calculate_log_probs=true"]),
    ({"algorithm.rollout_correction.rollout_rs_threshold_lower": 2.5, "algorithm.rollout_correction.rollout_rs": "token",
      "algorithm.rollout_correction.rollout_rs_threshold": 2.0, f"{ARR}.rollout.calculate_log_probs": True},
     ["algorithm.rollout_correction.rollout_rs_threshold_lower=2.5 is invalid", "e.g. 0.5"]),
    # zero / negative sizes
    ({"data.train_batch_size": 0}, ["data.train_batch_size=0", "must be an integer >= 1", "data.train_batch_size=1"]),
    ({f"{ARR}.actor.ppo_epochs": -1}, [f"{ARR}.actor.ppo_epochs=-1", f"{ARR}.actor.ppo_epochs=1"]),
    ({"trainer.test_freq": 0}, ["trainer.test_freq=0", "trainer.test_freq=-1"]),
    ({f"{ARR}.ref.log_prob_micro_batch_size_per_gpu": 0}, ["ref.log_prob_micro_batch_size_per_gpu=0", "=16"]),
    # ranges and combinations
    ({f"{ARR}.rollout.gpu_memory_utilization": 1.2}, ["gpu_memory_utilization=1.2", "(0, 1]",
                                                      "gpu_memory_utilization=1.0"]),
    ({f"{ARR}.rollout.gpu_memory_utilization": 0.0}, ["gpu_memory_utilization=0.0", "gpu_memory_utilization=0.1"]),
    ({f"{ARR}.rollout.val_kwargs.do_sample": True}, ["val_kwargs.do_sample=true", "val_kwargs.temperature=0",
                                                     "val_kwargs.do_sample=false"]),
    ({"algorithm.adv_estimator": "gae", "critic.enable": False}, ["critic.enable=false", "adv_estimator=gae",
                                                                   "critic.enable=null"]),
    ({f"{ARR}.rollout.name": "sglang"}, ["not supported yet", "rollout.name=sglang", "trainer.device=cpu",
                                         "rollout.name=vllm"]),
    ({"trainer.resume_mode": "resume_path"}, ["resume_from_path=null", "trainer.resume_from_path="]),
    ({f"{ARR}.actor.use_dynamic_bsz": True, f"{ARR}.actor.ppo_max_token_len_per_gpu": 100},
     ["ppo_max_token_len_per_gpu=100", "ppo_max_token_len_per_gpu=1024"]),
    # FSDP engine knobs
    ({"reward_model.launch_reward_fn_async": True, "algorithm.filter_groups.enable": True},
     ["launch_reward_fn_async=true", "filter_groups.enable=true", "use reward_model.launch_reward_fn_async=false"]),
    ({f"{ARR}.actor.fsdp_config.model_dtype": "fp16"}, ["model_dtype=fp16", "must be one of fp32, float32, bf16, bfloat16"]),
    ({f"{ARR}.rollout.update_weights_bucket_megabytes": 0}, ["update_weights_bucket_megabytes=0", "must be an "
                                                             "integer >= 1"]),
]


@pytest.mark.parametrize("values, parts", RULES, ids=[str(list(v.items())[0][0]) + str(i) for i, (v, _) in
                                                       enumerate(RULES)])
def test_rule_message(small_cfg, values, parts):
    with pytest.raises(ConfigError) as err:
        validate_config(small_cfg(values))
    message = str(err.value)
    assert [p for p in parts if p not in message] == [], message
    assert "\n" not in message


def _refused_value(key: str, refusal) -> object:
    """A value of the key's type that the table refuses."""
    if refusal.never is not None:
        return [refusal.never[0]] if key == "trainer.logger" else refusal.never[0]
    first = refusal.only[0]
    if isinstance(first, bool):
        return not first
    if first is None or first == []:
        if key.endswith(("ranks", "profile_steps", "steps")):
            return [1]
        if key.endswith(("_lower", "_threshold", "loss_scale_factor", "dro_beta", "weight_offset")):
            return 0.5
        if key.endswith(("num_repeat_rollouts", "codapo_top_k")):
            return 2
        if key.endswith("modules_to_save"):
            return ["visual.merger"]
        return {"path": "/x"} if key.endswith(("override_optimizer_config", "ref.model")) else "some_value"
    if isinstance(first, str):
        return "something_else"
    if isinstance(first, dict):
        return {"method": "flexible"}
    return first + 1


@pytest.mark.parametrize("key", sorted(NOT_SUPPORTED_YET))
def test_not_supported_yet_table(small_cfg, key):
    value = _refused_value(key, NOT_SUPPORTED_YET[key])
    with pytest.raises(ConfigError, match="not supported yet") as err:
        validate_config(small_cfg({key: value}))
    assert key in str(err.value) and "use " in str(err.value)


@pytest.mark.parametrize("estimator", ["grpo", "rloo"])
def test_a_group_estimator_with_one_response_warns_and_runs_as_in_verl(small_cfg, estimator):
    cfg = small_cfg({f"{ARR}.rollout.n": 1, "algorithm.adv_estimator": estimator})
    with pytest.warns(ConfigWarning, match=f"{estimator} compares the responses of one prompt.*"
                                           f"set {ARR}.rollout.n=4"):
        validate_config(cfg)


def test_double_kl_warns(small_cfg):
    with pytest.warns(ConfigWarning, match="double KL penalty"):
        validate_config(small_cfg({"algorithm.use_kl_in_reward": True}))


def test_built_features_are_accepted(small_cfg):
    cfg = small_cfg({
        f"{ARR}.actor.fsdp_config.param_offload": True, f"{ARR}.actor.fsdp_config.optimizer_offload": True,
        f"{ARR}.model.enable_gradient_checkpointing": True, f"{ARR}.model.use_remove_padding": True,
        f"{ARR}.actor.use_dynamic_bsz": True, f"{ARR}.rollout.name": "hf", "reward_model.enable": True,
        "trainer.logger": ["console", "file", "wandb", "tensorboard", "mlflow"], "algorithm.use_pf_ppo": True,
        "custom_reward_function.path": "/tmp/r.py", "trainer.save_freq": 5,
        f"{ARR}.actor.fsdp_config.model_dtype": "bf16", "critic.model.fsdp_config.model_dtype": "bfloat16",
        f"{ARR}.ref.fsdp_config.forward_prefetch": True, "critic.model.fsdp_config.forward_prefetch": True,
        f"{ARR}.model.enable_activation_offload": True, "critic.model.enable_activation_offload": True,
        f"{ARR}.model.use_shm": True, "critic.model.use_shm": True, "data.use_shm": True,
        "reward_model.launch_reward_fn_async": True, "reward_model.model.use_shm": True,
        "reward_model.model.fsdp_config.forward_prefetch": True,
    })
    assert validate_config(cfg).actor_rollout_ref.rollout.name == "hf"
