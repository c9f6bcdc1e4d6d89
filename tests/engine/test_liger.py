"""`model.use_liger`: the model loader puts Liger's RMSNorm, SwiGLU and RoPE into a tiny Qwen2 on CPU (the
Triton kernels themselves run in tests/gpu/test_liger_gpu.py) and leaves the causal LM's forward as HF's."""

import pytest
import torch

from _compose import SMALL, compose_config
from rlpost.utils.model import load_model

monkey_patch = pytest.importorskip("liger_kernel.transformers.monkey_patch")

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def restore_qwen2(monkeypatch):
    """Liger also rebinds names in transformers' qwen2 modelling file: put them back after the test, so later
    CPU tests in this process build plain Qwen2 models."""
    from transformers.models.qwen2 import modeling_qwen2

    for name in ("apply_rotary_pos_emb", "Qwen2RMSNorm", "Qwen2MLP"):
        monkeypatch.setattr(modeling_qwen2, name, getattr(modeling_qwen2, name))
    return modeling_qwen2


def _model_cfg(tiny_model_dir: str, use_liger: bool):
    """The composed `actor_rollout_ref.model` group; a CUDA run (start-up refuses Liger on CPU), loaded here on CPU."""
    cfg = compose_config(*SMALL, "trainer.device=cuda", f"actor_rollout_ref.model.path={tiny_model_dir}",
                         "actor_rollout_ref.rollout.name=hf", f"actor_rollout_ref.model.use_liger={str(use_liger).lower()}")
    return cfg.actor_rollout_ref.model


def test_load_model_patches_norms_mlps_and_rope(tiny_model_dir, restore_qwen2):
    from liger_kernel.transformers.rms_norm import LigerRMSNorm
    from liger_kernel.transformers.rope import liger_rotary_pos_emb
    from liger_kernel.transformers.swiglu import LigerSwiGLUMLP

    plain = load_model(_model_cfg(tiny_model_dir, False), torch.float32)
    model = load_model(_model_cfg(tiny_model_dir, True), torch.float32)
    layers = model.model.layers
    assert len(layers) == 2
    norms = [model.model.norm] + [n for layer in layers for n in (layer.input_layernorm, layer.post_attention_layernorm)]
    for norm in norms:
        assert norm.forward.__func__ is LigerRMSNorm.forward
        assert norm.casting_mode == "llama" and norm.offset == 0.0
    for layer in layers:
        assert layer.mlp.forward.__func__ is LigerSwiGLUMLP.forward
        assert layer.mlp._get_name() == "LigerSwiGLUMLP"
    assert restore_qwen2.apply_rotary_pos_emb is liger_rotary_pos_emb
    # fused linear cross-entropy stays off: the causal LM's forward (hence the logits) is HF's own
    assert "forward" not in model.__dict__ and type(model).forward is type(plain).forward
    # the loaded model of the plain config was not touched, and the weights are the same
    assert plain.model.norm.forward.__func__ is not LigerRMSNorm.forward
    for (name, a), (_, b) in zip(model.state_dict().items(), plain.state_dict().items()):
        assert torch.equal(a, b), name


def test_unpatched_model_type_is_refused(restore_qwen2):
    from transformers import GPT2Config, GPT2LMHeadModel

    from rlpost.engine.liger import apply_liger, liger_model_types

    assert "gpt2" not in liger_model_types() and "qwen2" in liger_model_types()
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=32, n_positions=8))
    with pytest.raises(ValueError, match=r"model_type=gpt2 \(it patches .*qwen2.*\); use actor_rollout_ref.model.use_liger=false"):
        apply_liger(model)
