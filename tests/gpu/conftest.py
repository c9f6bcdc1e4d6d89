"""GPU tests: collected everywhere, skipped without CUDA (CI has none); run on the GPU host (docs/gpu.md)."""

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "tests/gpu/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.gpu)
            if not torch.cuda.is_available():
                item.add_marker(skip)


@pytest.fixture(scope="module")
def hf_model(tiny_model_dir):
    """The tiny model with sharpened logits on the GPU, weights exactly bf16 (`engine_checks.sharpened_hf_model`)."""
    from engine_checks import sharpened_hf_model

    return sharpened_hf_model(tiny_model_dir)


@pytest.fixture(scope="module")
def qwen05b_layers_dir(tmp_path_factory) -> str:
    """Random Qwen2 with Qwen2.5-0.5B's layer shapes (hidden 896, 14 heads, 2 KV heads, MLP 4864), 2 layers."""
    from rlpost.utils.tiny_model import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("qwen05b_layers"), hidden_size=896, num_heads=14,
                                num_kv_heads=2, intermediate_size=4864))


@pytest.fixture
def restore_qwen2(monkeypatch):
    """Liger rebinds names in transformers' qwen2 modelling file: they are put back after the test, so later
    tests' plain models are plain."""
    from transformers.models.qwen2 import modeling_qwen2

    for name in ("apply_rotary_pos_emb", "Qwen2RMSNorm", "Qwen2MLP"):
        monkeypatch.setattr(modeling_qwen2, name, getattr(modeling_qwen2, name))
