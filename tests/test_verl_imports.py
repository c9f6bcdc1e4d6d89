"""verl's import paths used by recipes and custom workers resolve after renaming `verl` to `rlpost`."""

import importlib

import pytest

IMPORTS = [
    ("rlpost", ["DataProto"]),
    ("rlpost.protocol", ["DataProto", "pad_dataproto_to_divisor", "unpad_dataproto", "union_tensor_dict",
                         "union_numpy_dict", "fold_batch_dim", "unfold_batch_dim", "serialize_single_tensor",
                         "serialize_tensordict", "deserialize_single_tensor", "deserialize_tensordict",
                         "DataProtoConfig", "list_of_dict_to_dict_of_list"]),
    ("rlpost.trainer.ppo.core_algos", ["agg_loss", "AdvantageEstimator", "compute_advantage", "apply_kl_penalty",
                                       "register_adv_est", "register_policy_loss", "get_policy_loss_fn",
                                       "ADV_ESTIMATOR_REGISTRY", "POLICY_LOSS_REGISTRY", "compute_policy_loss_dro",
                                       "compute_value_loss"]),
    ("rlpost.trainer.ppo.metric_utils", ["compute_data_metrics", "compute_throughout_metrics",
                                         "compute_timing_metrics", "reduce_metrics"]),
    ("rlpost.trainer.ppo.ray_trainer", ["AdvantageEstimator", "RayPPOTrainer", "ResourcePoolManager", "Role",
                                        "apply_kl_penalty", "compute_advantage", "compute_response_mask"]),
    ("rlpost.trainer.ppo.reward", ["compute_reward", "load_reward_manager"]),
    ("rlpost.trainer.ppo.utils", ["Role", "need_critic", "need_reference_policy", "need_reward_model"]),
    ("rlpost.trainer.main_ppo", ["TaskRunner", "run_ppo", "create_rl_dataset", "create_rl_sampler"]),
    ("rlpost.utils", ["hf_tokenizer", "hf_processor"]),
    ("rlpost.utils.fs", ["copy_to_local", "copy_local_path_from_hdfs", "is_non_local"]),
    ("rlpost.utils.profiler", ["marked_timer", "simple_timer"]),
    ("rlpost.utils.tracking", ["Tracking"]),
    ("rlpost.utils.dataset.rl_dataset", ["RLHFDataset", "collate_fn"]),
    ("rlpost.utils.reward_score", ["default_compute_score"]),
    ("rlpost.single_controller.ray", ["RayWorkerGroup", "RayResourcePool", "RayClassWithInitArgs"]),
    ("rlpost.single_controller.base", ["Worker"]),
    ("rlpost.single_controller.base.decorator", ["register", "Dispatch", "Execute"]),
    ("rlpost.workers.fsdp_workers", ["ActorRolloutRefWorker", "CriticWorker"]),
    ("rlpost.workers.reward_manager", ["NaiveRewardManager", "DAPORewardManager", "PrimeRewardManager",
                                       "BatchRewardManager", "register", "get_reward_manager_cls",
                                       "AbstractRewardManager"]),
    ("rlpost.workers.reward_manager.abstract", ["AbstractRewardManager"]),
    ("rlpost.utils.torch_functional", ["masked_mean", "masked_whiten", "logprobs_from_logits", "entropy_from_logits",
                                       "get_response_mask", "pad_sequence_to_length", "postprocess_data",
                                       "tokenize_and_postprocess_data", "distributed_mean_max_min_std",
                                       "distributed_masked_mean", "calculate_sum_pi_squared_from_logits",
                                       "expand_as_nested"]),
    ("rlpost.utils.hdfs_io", ["copy", "makedirs", "exists"]),
    ("rlpost.utils.device", ["get_device_name", "get_torch_device", "get_device_id", "is_cuda_available"]),
    ("rlpost.utils.rollout_trace", ["rollout_trace_op", "rollout_trace_attr"]),
    ("rlpost.experimental.agent_loop", ["AgentLoopBase", "AsyncLLMServerManager"]),
    ("rlpost.utils.model", ["compute_position_id_with_mask", "update_model_config", "create_random_mask"]),
    ("rlpost.utils.seqlen_balancing", ["get_seqlen_balanced_partitions", "log_seqlen_unbalance",
                                       "prepare_dynamic_batch", "restore_dynamic_batch",
                                       "get_group_balanced_partitions", "get_reverse_idx", "ceildiv",
                                       "roundup_divisible", "calculate_workload"]),
    ("rlpost.utils.import_utils", ["load_extern_type", "import_external_libs"]),
    ("rlpost.utils.metric", ["reduce_metrics", "Metric", "AggregationType"]),
    ("rlpost.utils.metric.utils", ["reduce_metrics", "Metric", "AggregationType"]),
    ("rlpost.utils.py_functional", ["append_to_dict", "temp_env_var", "timeout_limit", "union_two_dict"]),
    ("rlpost.utils.tokenizer", ["hf_tokenizer", "hf_processor", "normalize_token_ids"]),
    ("rlpost.workers.reward_manager.registry", ["REWARD_MANAGER_REGISTRY", "register", "get_reward_manager_cls"]),
    ("rlpost.trainer.constants_ppo", ["get_ppo_ray_runtime_env"]),
    ("rlpost.experimental.agent_loop.agent_loop", ["AgentLoopBase", "AgentLoopOutput", "AgentLoopMetrics",
                                                   "register"]),
]


@pytest.mark.parametrize("module, names", IMPORTS, ids=[m for m, _ in IMPORTS])
def test_verl_import_path(module, names):
    mod = importlib.import_module(module)
    missing = [n for n in names if not hasattr(mod, n)]
    assert missing == []


def test_marked_timer_adds_wall_time():
    from rlpost.utils.profiler import marked_timer

    timing: dict[str, float] = {}
    with marked_timer("gen", timing, color="red"):
        pass
    with marked_timer("gen", timing):
        pass
    assert set(timing) == {"gen"} and 0 <= timing["gen"] < 1


def test_reduce_metrics_means_lists():
    from rlpost.trainer.ppo.metric_utils import reduce_metrics

    assert reduce_metrics({"a": [1.0, 2.0, 3.0], "b": 4}) == {"a": 2.0, "b": 4}


def test_copy_to_local_refuses_remote_paths(tmp_path):
    from rlpost.utils.fs import copy_to_local

    assert copy_to_local(str(tmp_path)) == str(tmp_path)
    with pytest.raises(ValueError, match="remote locations"):
        copy_to_local("hdfs://cluster/models/x")


def test_reward_manager_registry_alias():
    from rlpost.workers.reward_manager import NaiveRewardManager, get_reward_manager_cls

    assert get_reward_manager_cls("naive") is NaiveRewardManager


def test_hf_tokenizer_sets_a_pad_token(tiny_model_dir):
    from rlpost.utils import hf_processor, hf_tokenizer

    tok = hf_tokenizer(tiny_model_dir)
    assert tok.pad_token_id is not None
    assert hf_processor(tiny_model_dir) is None  # a text model has no multimodal processor


def test_launch_tokenizer_honours_tokenizer_path_and_custom_template(tiny_model_dir, tmp_path):
    from omegaconf import OmegaConf

    from rlpost.trainer.ppo.launch import load_tokenizer

    template = "{% for m in messages %}<<{{ m['content'] }}>>{% endfor %}"
    cfg = OmegaConf.create({"data": {"tokenizer": None, "trust_remote_code": False},
                            "actor_rollout_ref": {"model": {"path": str(tmp_path / "no_such_model"),
                                                            "tokenizer_path": tiny_model_dir,
                                                            "custom_chat_template": template}}})
    tok = load_tokenizer(cfg)
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert text == "<<hi>>" and tok.padding_side == "left"
