"""init_ray's config checks and the runtime_env passed to workers (no Ray start here)."""

import pytest

from rlpost.single_controller.ray.init import build_runtime_env, finish_ray, init_ray


def test_runtime_env_passes_worker_vars(monkeypatch):
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "2")
    env = build_runtime_env({"env_vars": {"HF_HUB_OFFLINE": "0", "EXTRA": 1}, "working_dir": "."})
    assert env["env_vars"] == {
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_CPU_KVCACHE_SPACE": "2",
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "0",
        "EXTRA": "1",
    }
    assert env["working_dir"] == "."


def test_unknown_ray_init_key_is_rejected():
    with pytest.raises(ValueError, match="not supported yet: ray_init.address"):
        init_ray({"num_cpus": 2, "address": "auto"})
    with pytest.raises(ValueError, match="not supported yet: ray_init.object_store"):
        finish_ray({"object_store": 1})
