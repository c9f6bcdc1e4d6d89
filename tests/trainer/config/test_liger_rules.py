"""Start-up checks of `actor_rollout_ref.model.use_liger=true`: a CUDA run, liger_kernel importable, and a model
type Liger patches, each refused in one message naming the key and a value that works."""

import json
import sys

import pytest

from rlpost.trainer.config import validate_config
from rlpost.engine.liger import LIGER_REQUIREMENT

ARR = "actor_rollout_ref"
LIGER = {f"{ARR}.model.use_liger": True}
ON_GPU = {**LIGER, "trainer.device": "cuda"}

pytestmark = pytest.mark.timeout(120)


def _model_dir(tmp_path, model_type: str) -> str:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": model_type, "num_attention_heads": 2}))
    return str(tmp_path)


def test_refused_on_cpu(config_error):
    msg = config_error(LIGER)
    assert msg.startswith(f"{ARR}.model.use_liger=true, trainer.device=cpu: ")
    assert "Triton kernels for CUDA GPUs" in msg and f"use {ARR}.model.use_liger=false" in msg


def test_refused_without_the_package(config_error, monkeypatch):
    monkeypatch.setitem(sys.modules, "liger_kernel", None)  # `import liger_kernel...` raises ImportError
    monkeypatch.setitem(sys.modules, "liger_kernel.transformers.monkey_patch", None)
    msg = config_error(ON_GPU)
    assert msg.startswith(f"{ARR}.model.use_liger=true: liger_kernel is not importable")
    assert f"use `pip install {LIGER_REQUIREMENT}`" in msg and f"{ARR}.model.use_liger=false" in msg


def test_refused_for_a_model_type_liger_does_not_patch(config_error, tmp_path):
    pytest.importorskip("liger_kernel.transformers.monkey_patch")
    path = _model_dir(tmp_path, "gpt2")
    msg = config_error({**ON_GPU, f"{ARR}.model.path": path})
    assert msg.startswith(f"{ARR}.model.use_liger=true, {ARR}.model.path={path} (model_type=gpt2): ")
    assert "Liger patches only the model types " in msg and "qwen2, qwen2_5_vl" in msg and "llama" in msg
    assert msg.endswith(f"use {ARR}.model.use_liger=false.")


def test_accepted_for_qwen2_on_cuda(small_cfg, tmp_path):
    pytest.importorskip("liger_kernel.transformers.monkey_patch")
    cfg = validate_config(small_cfg({**ON_GPU, f"{ARR}.model.path": _model_dir(tmp_path, "qwen2")}))
    assert cfg.actor_rollout_ref.model.use_liger is True
