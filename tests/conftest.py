"""Shared fixtures: a tiny model built once per session, offline settings for every test."""

import os

import pytest

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """Path of a tiny Qwen2 model + tokenizer (2 layers, hidden 128, head_dim 64), built offline."""
    from rlpost.utils.tiny_model import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("tiny_model")))


@pytest.fixture(scope="session")
def tiny_vl_model_dir(tmp_path_factory):
    """Path of a tiny Qwen2-VL model + processor (2 layers, hidden 128, 2 vision blocks), built offline."""
    from rlpost.utils.tiny_vl_model import build_tiny_vl_model

    return str(build_tiny_vl_model(tmp_path_factory.mktemp("tiny_vl_model")))


@pytest.fixture(scope="session")
def sandbox():
    """A real sandbox service (`python -m rlpost.sandbox.serve`, 2 workers) on a free port; `.url`, `.pid`."""
    from rlpost.sandbox.local import LocalSandbox

    service = LocalSandbox(workers=2)
    yield service
    service.stop()
