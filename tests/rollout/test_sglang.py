"""SGLang engine: guarded import and config mapping on CPU; a real engine only on GPU."""

import pytest
import torch

from _compose import SMALL, compose_config
from rlpost.rollout import build_rollout
from rlpost.rollout.base import SamplingSpec
from rlpost.rollout.sglang import engine_kwargs, sampling_params


def _rollout_cfg(*overrides: str, name: str = "sglang"):
    """`actor_rollout_ref.rollout` of the default config on a GPU run (sglang is refused with device=cpu)."""
    return compose_config(*SMALL, "trainer.device=cuda", f"actor_rollout_ref.rollout.name={name}",
                          *overrides).actor_rollout_ref.rollout


def test_choosing_sglang_without_gpu_says_what_is_needed():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        build_rollout(_rollout_cfg(), "/m", None, "cpu")


def test_unknown_engine_name_lists_valid_ones():
    cfg = compose_config(*SMALL, "actor_rollout_ref.rollout.name=vlm", validate=False).actor_rollout_ref.rollout
    with pytest.raises(ValueError, match="'vlm'.*valid"):
        build_rollout(cfg, "/m", None, "cpu")


def test_sglang_kwargs_and_sampling_mapping():
    backend = "actor_rollout_ref.rollout.engine_kwargs.sglang.attention_backend=triton"
    cfg = _rollout_cfg("actor_rollout_ref.rollout.gpu_memory_utilization=0.6", backend)
    kw = engine_kwargs(cfg, "/m")
    assert kw["mem_fraction_static"] == 0.6 and kw["attention_backend"] == "triton"
    assert kw["context_length"] == 16 + 8 and kw["load_format"] == "dummy"
    explicit = _rollout_cfg("actor_rollout_ref.rollout.gpu_memory_utilization=0.6", backend,
                            "actor_rollout_ref.rollout.engine_kwargs.sglang.mem_fraction_static=0.8")
    assert engine_kwargs(explicit, "/m")["mem_fraction_static"] == 0.8
    spec = SamplingSpec(greedy=False, temperature=0.9, top_k=0, top_p=0.95, max_tokens=8, ignore_eos=False,
                        logprobs=True)
    sp = sampling_params(spec, {2})
    assert sp["top_k"] == -1 and sp["temperature"] == 0.9 and sp["stop_token_ids"] == [2]
    assert sp["max_new_tokens"] == 8 and sp["n"] == 1


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU and sglang")
def test_sglang_engine_generates_on_gpu(tiny_model_dir):
    pytest.importorskip("sglang")
    from transformers import AutoTokenizer

    from rlpost import keys
    from rlpost.protocol import DataProto

    tok = AutoTokenizer.from_pretrained(tiny_model_dir, padding_side="left")
    cfg = _rollout_cfg("actor_rollout_ref.rollout.load_format=hf", "data.max_response_length=4",
                       "actor_rollout_ref.rollout.gpu_memory_utilization=0.3", "actor_rollout_ref.rollout.dtype=float32",
                       "trainer.n_gpus_per_node=1")
    rollout = build_rollout(cfg, tiny_model_dir, tok, "cuda")
    enc = tok(["hi", "What is 1 + 2?"], return_tensors="pt", padding=True)
    pos = (enc.attention_mask.cumsum(-1) - 1).clamp(min=0)
    data = DataProto.from_dict(
        tensors={keys.INPUT_IDS: enc.input_ids, keys.ATTENTION_MASK: enc.attention_mask, keys.POSITION_IDS: pos},
        meta_info={keys.META_EOS_TOKEN_ID: tok.eos_token_id, keys.META_PAD_TOKEN_ID: tok.pad_token_id},
    )
    out = rollout.generate_sequences(data)
    assert out.batch[keys.RESPONSES].shape == (2, 4)
