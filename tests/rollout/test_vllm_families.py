"""vLLM's CPU engine per architecture family: it starts from dummy weights, so everything it generates with comes
through rlpost's in-place weight sync (HF names -> the engine's fused experts, fused qkv / gate-up, soft-capped
and windowed attention). After the sync its greedy output equals the trainer's HF model's, and the probability
drift between the two stays small; families it cannot run right on a CPU are refused at start-up."""

import gc

import numpy as np
import pytest
import torch

from _compose import SMALL, compose_config
from rlpost import keys
from rlpost.rollout.drift import rollout_probs_diff
from rlpost.protocol import DataProto
from rlpost.utils.model_traits import engine_refusal, model_traits
from rlpost.utils.tiny_families import FAMILIES
from rlpost.utils.weight_names import checkpoint_names

pytestmark = pytest.mark.timeout(600)

R = 6
REFUSED_ON_CPU = {"deepseek_v3", "glm4_moe", "gpt_oss", "qwen3_5", "qwen3_next"}
ENGINE_FAMILIES = [f for f in sorted(FAMILIES) if f != "qwen2"]  # qwen2: tests/rollout/test_vllm.py


def _perturb(model, seed: int, scale: float = 0.5) -> None:
    """Sharpen the random model so that greedy outputs vary with the prompt."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * scale * p.abs().mean().clamp(min=0.02))


def _batch(tok, texts) -> DataProto:
    enc = tok(texts, return_tensors="pt", padding=True)
    pos = (enc.attention_mask.cumsum(-1) - 1).clamp(min=0)
    return DataProto.from_dict(
        tensors={keys.INPUT_IDS: enc.input_ids, keys.ATTENTION_MASK: enc.attention_mask, keys.POSITION_IDS: pos},
        non_tensors={keys.UID: np.array([f"u{i}" for i in range(len(texts))], dtype=object)},
        meta_info={keys.META_EOS_TOKEN_ID: tok.eos_token_id, keys.META_PAD_TOKEN_ID: tok.pad_token_id,
                   "do_sample": False})


def _vllm_cpu_refusal(name: str, path: str) -> str | None:
    from transformers import AutoConfig

    return engine_refusal(model_traits(AutoConfig.from_pretrained(path)), "vllm", "cpu")


@pytest.mark.parametrize("name", ENGINE_FAMILIES)
def test_sync_then_greedy_equals_hf(name, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlpost.rollout import build_rollout
    from rlpost.utils.tiny_model import build_tiny_model

    path = str(build_tiny_model(tmp_path / name, arch=name, vocab_size=256))
    refused = _vllm_cpu_refusal(name, path)
    assert bool(refused) == (name in REFUSED_ON_CPU), refused
    if refused:  # start-up stops it (tests/trainer/ppo/test_model_family_preflight.py runs main_ppo on one)
        assert refused.endswith("set actor_rollout_ref.rollout.name=hf on CPU (vLLM on CUDA has its own kernels for it)")
        return
    tok = AutoTokenizer.from_pretrained(path, padding_side="left")
    cfg = compose_config(*SMALL, "actor_rollout_ref.rollout.name=vllm", "trainer.device=cpu",
                         "actor_rollout_ref.rollout.dtype=float32", "data.max_prompt_length=32",
                         f"data.max_response_length={R}", "actor_rollout_ref.rollout.calculate_log_probs=true",
                         "actor_rollout_ref.rollout.max_num_seqs=8").actor_rollout_ref.rollout
    assert cfg.load_format == "dummy_dtensor"  # the engine's own weights are random: only the sync sets them
    actor = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()
    _perturb(actor, seed=1)
    rollout = build_rollout(cfg, path, tok, "cpu")
    try:
        rollout.update_weights(checkpoint_names(actor, actor.state_dict().items()))
        data = _batch(tok, ["What is 12 + 7?", "hi", "3 * 4 = 12. #### 12", "You are"])
        cfg.ignore_eos = True
        out = rollout.generate_sequences(data)
        ids, mask = data.batch[keys.INPUT_IDS], data.batch[keys.ATTENTION_MASK]
        want = actor.generate(input_ids=ids, attention_mask=mask, max_new_tokens=R, do_sample=False,
                              eos_token_id=None, pad_token_id=0)[:, ids.shape[1]:]
        assert out.batch[keys.RESPONSES].tolist() == want.tolist(), name
        full = out.batch[keys.INPUT_IDS]
        with torch.no_grad():
            logits = actor(input_ids=full, attention_mask=out.batch[keys.ATTENTION_MASK],
                           position_ids=out.batch[keys.POSITION_IDS]).logits
        lp = torch.log_softmax(logits[:, ids.shape[1] - 1:-1].float(), -1)
        actor_lp = lp.gather(-1, out.batch[keys.RESPONSES][..., None]).squeeze(-1)
        drift = rollout_probs_diff(out.batch[keys.ROLLOUT_LOG_PROBS], actor_lp, out.batch[keys.RESPONSE_MASK])
        assert drift["training/rollout_probs_diff_max"] < 1e-2, (name, drift)
    finally:
        del rollout
        gc.collect()
