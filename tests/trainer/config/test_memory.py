"""The start-up memory estimate against a device: verl's usual launches fit, others are refused with a knob
and a value that fits."""

import json
import re

import pytest

from rlpost.trainer.config import ConfigError, typed_config
from rlpost.trainer.config.memory import check_memory_fit, memory_lines, run_memory
from rlpost.trainer.main_ppo import run
from rlpost.utils.memory_estimate import GIB

pytestmark = pytest.mark.timeout(60)
ARR = "actor_rollout_ref"
QWEN_05B = {"hidden_size": 896, "intermediate_size": 4864, "num_attention_heads": 14, "num_hidden_layers": 24,
            "num_key_value_heads": 2, "vocab_size": 151936, "tie_word_embeddings": True, "model_type": "qwen2"}
QWEN_7B = {"hidden_size": 3584, "intermediate_size": 18944, "num_attention_heads": 28, "num_hidden_layers": 28,
           "num_key_value_heads": 4, "vocab_size": 152064, "tie_word_embeddings": False, "model_type": "qwen2"}
H100 = int(79.2 * GIB)


def model_dir(tmp_path, name: str, config: dict) -> str:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


def grpo(make_cfg, path: str, gpus: int, micro: int, util: float, **extra):
    """verl's GRPO example launch: 64 prompts x 8, 512 + 512 tokens, KL loss, gradient checkpointing."""
    values = {"algorithm.adv_estimator": "grpo", f"{ARR}.model.path": path, "trainer.n_gpus_per_node": gpus,
              "data.train_batch_size": 64, f"{ARR}.rollout.n": 8, "data.max_prompt_length": 512,
              "data.max_response_length": 512, f"{ARR}.actor.ppo_mini_batch_size": 64,
              f"{ARR}.actor.use_kl_loss": True, f"{ARR}.model.enable_gradient_checkpointing": True,
              f"{ARR}.actor.ppo_micro_batch_size_per_gpu": micro,
              f"{ARR}.rollout.log_prob_micro_batch_size_per_gpu": micro,
              f"{ARR}.ref.log_prob_micro_batch_size_per_gpu": micro, f"{ARR}.rollout.gpu_memory_utilization": util,
              f"{ARR}.rollout.tensor_model_parallel_size": min(gpus, 2), **extra}
    return typed_config(make_cfg(values))


def test_usual_verl_launches_fit(make_cfg, tmp_path):
    small, big = model_dir(tmp_path, "q05", QWEN_05B), model_dir(tmp_path, "q7", QWEN_7B)
    for c in (grpo(make_cfg, small, 1, 32, 0.6), grpo(make_cfg, small, 1, 16, 0.8),
              grpo(make_cfg, big, 8, 16, 0.6), grpo(make_cfg, big, 8, 32, 0.6)):
        check_memory_fit(run_memory(c), H100, "test")  # does not raise
    lines = memory_lines(grpo(make_cfg, small, 1, 32, 0.6), H100)
    assert [line.split()[0] for line in lines[1:]] == ["gen", "old_log_prob", "ref", "update_actor"]
    gen = float(lines[1].split()[1])  # 0.6 x 79.2 GiB engine + fp32 params, AdamW moments, bf16 reference
    assert gen == pytest.approx(0.6 * 79.2 + 0.494 * (4 + 8 + 2) * 1e9 / GIB, abs=0.05)


def fixed_value(err: ConfigError, key: str) -> float:
    return float(re.search(rf"use {re.escape(key)}=([0-9]+(?:\.[0-9]+)?)", str(err)).group(1))


def test_engine_share_too_large_names_a_share_that_fits(make_cfg, tmp_path):
    c = grpo(make_cfg, model_dir(tmp_path, "q7", QWEN_7B), 1, 4, 0.9, **{
        "data.train_batch_size": 8, f"{ARR}.actor.ppo_mini_batch_size": 8})
    key = f"{ARR}.rollout.gpu_memory_utilization"
    with pytest.raises(ConfigError, match=r"memory: phase gen needs") as err:
        check_memory_fit(run_memory(c), H100, "test")
    # 7.6B params on one device: fp32 params 28.4 GiB + moments 56.8 GiB do not fit next to any engine share
    assert "optimizer_offload=true" in str(err.value)
    c = grpo(make_cfg, model_dir(tmp_path, "q05", QWEN_05B), 1, 8, 0.95)
    with pytest.raises(ConfigError) as err:
        check_memory_fit(run_memory(c), H100, "trainer.device_memory_gb=79.2")
    assert f"{key}=0.95" in str(err.value) and "79.2 GiB of the device (trainer.device_memory_gb=79.2)" in str(
        err.value)
    util = fixed_value(err.value, key)
    assert util == pytest.approx(0.85)  # 6.4 GiB state + 1.5 GiB overhead leave 0.90 x 79.2 GiB; 0.05 steps
    check_memory_fit(run_memory(grpo(make_cfg, c.actor_rollout_ref.model.path, 1, 8, util)), H100, "test")


def test_micro_batch_too_large_names_one_that_fits(make_cfg, tmp_path):
    path = model_dir(tmp_path, "q05", QWEN_05B)
    no_ckpt = {f"{ARR}.model.enable_gradient_checkpointing": False, "data.max_response_length": 1536}
    key = f"{ARR}.actor.ppo_micro_batch_size_per_gpu"

    def launch(micro: int):  # no gradient checkpointing: every layer keeps its activations
        return grpo(make_cfg, path, 1, micro, 0.5, **no_ckpt, **{f"{ARR}.rollout.log_prob_micro_batch_size_per_gpu": 4,
                                                                 f"{ARR}.ref.log_prob_micro_batch_size_per_gpu": 4})

    with pytest.raises(ConfigError, match="phase update_actor") as err:
        check_memory_fit(run_memory(launch(32)), H100, "test")
    micro = int(fixed_value(err.value, key))
    assert micro in (4, 8, 16)  # halved from 32 until the estimate fits
    check_memory_fit(run_memory(launch(micro)), H100, "test")
    with pytest.raises(ConfigError):
        check_memory_fit(run_memory(launch(2 * micro)), H100, "test")


def test_dry_run_prints_the_estimate_and_refuses(make_cfg, tmp_path, capsys):
    path = model_dir(tmp_path, "q05", QWEN_05B)
    base = {"algorithm.adv_estimator": "grpo", f"{ARR}.model.path": path, "trainer.n_gpus_per_node": 1,
            f"{ARR}.rollout.n": 4, f"{ARR}.rollout.tensor_model_parallel_size": 1, "trainer.dry_run": True, "data.train_batch_size": 8,
            f"{ARR}.actor.ppo_mini_batch_size": 8, f"{ARR}.actor.ppo_micro_batch_size_per_gpu": 4}
    assert run(make_cfg(base)) == 0  # a folder with config.json alone sizes the plan; its missing weights are said
    captured = capsys.readouterr()
    assert "set trainer.device_memory_gb" in captured.out and "holds config.json but no weights" in captured.err
    assert run(make_cfg({**base, "trainer.device_memory_gb": 80})) == 0
    assert "update_actor" in capsys.readouterr().out
    assert run(make_cfg({**base, "trainer.device_memory_gb": 40, f"{ARR}.rollout.gpu_memory_utilization": 0.95})) == 2
    assert "use actor_rollout_ref.rollout.gpu_memory_utilization=0." in capsys.readouterr().err


def test_estimate_metrics_only_on_gpu(make_cfg, tmp_path):
    from rlpost.trainer.ppo.preflight import estimate_metrics

    c = grpo(make_cfg, model_dir(tmp_path, "q05", QWEN_05B), 1, 32, 0.6, **{"trainer.device_memory_gb": 80})
    out = estimate_metrics(c)
    assert sorted(out) == [f"perf/estimated_memory_gb/{p}" for p in ("gen", "old_log_prob", "ref", "update_actor")]
    assert out["perf/estimated_memory_gb/gen"] == pytest.approx(0.6 * 80 + 0.494 * 14 * 1e9 / GIB, abs=0.05)
    cpu = grpo(make_cfg, c.actor_rollout_ref.model.path, 1, 32, 0.6, **{"trainer.device": "cpu"})
    assert estimate_metrics(cpu) == {}


def test_separate_rollout_devices_keep_the_engine_off_the_trainer_devices(make_cfg, tmp_path):
    """hybrid_engine=false: the engine has its own devices, so no trainer phase counts its share (seen on 2 H100s:
    the split launch of benchmarks/bench_async.py was refused with 63.7 GiB of engine on the trainer device)."""
    split = {f"{ARR}.hybrid_engine": False, f"{ARR}.rollout.n_gpus_per_node": 1, f"{ARR}.rollout.nnodes": 1,
             f"{ARR}.rollout.free_cache_engine": False, f"{ARR}.rollout.calculate_log_probs": True,
             f"{ARR}.rollout.tensor_model_parallel_size": 1}
    c = grpo(make_cfg, model_dir(tmp_path, "q05", QWEN_05B), 1, 32, 0.8, **split)
    lines = memory_lines(c, H100)
    assert not any("rollout engine" in line for line in lines), lines
    check_memory_fit(run_memory(c), H100, "test")  # 54 GiB update at micro 32: fits


def test_one_fsdp_unit_counts_the_whole_model_as_gathered(make_cfg, tmp_path):
    """wrap_policy.min_num_params above the model's size (the GPU examples' one-unit wrapping): every pass holds
    the whole bf16 model, and the update also its whole bf16 gradient, where per-layer units hold three units."""
    path = model_dir(tmp_path, "q05", QWEN_05B)

    def gathered(**extra) -> dict[str, float]:
        lines = memory_lines(grpo(make_cfg, path, 1, 32, 0.6, **extra), H100)[1:]
        return {ln.split()[0]: float(re.search(r"gathered ([0-9.]+)", ln).group(1)) for ln in lines if "gathered" in ln}

    whole = 0.494e9 * 2 / GIB
    per_layer = gathered()
    assert per_layer["old_log_prob"] < whole / 2
    one_unit = gathered(**{f"{ARR}.actor.fsdp_config.wrap_policy.min_num_params": 10**9,
                           f"{ARR}.ref.fsdp_config.wrap_policy.min_num_params": 10**9})
    assert one_unit["old_log_prob"] == pytest.approx(whole, abs=0.01)
    assert one_unit["ref"] == pytest.approx(whole, abs=0.01)
    assert one_unit["update_actor"] == pytest.approx(2 * whole, abs=0.01)
