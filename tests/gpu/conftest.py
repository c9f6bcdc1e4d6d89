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
