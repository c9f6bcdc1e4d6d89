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
            noise = torch.randn(p.shape, generator=gen).to(p.device, p.dtype)  # the same draw on any device
            p.add_(noise * scale * p.abs().mean().clamp(min=0.02))


def _batch(tok, texts) -> DataProto:
    enc = tok(texts, return_tensors="pt", padding=True)
    pos = (enc.attention_mask.cumsum(-1) - 1).clamp(min=0)
    return DataProto.from_dict(
        tensors={keys.INPUT_IDS: enc.input_ids, keys.ATTENTION_MASK: enc.attention_mask, keys.POSITION_IDS: pos},
        non_tensors={keys.UID: np.array([f"u{i}" for i in range(len(texts))], dtype=object)},
        meta_info={keys.META_EOS_TOKEN_ID: tok.eos_token_id, keys.META_PAD_TOKEN_ID: tok.pad_token_id,
                   "do_sample": False})


def sync_and_generate(name: str, folder, device: str, dtype: str = "float32", sharpen: float = 0.5):
    """Build the tiny `name` model in `folder`, start vLLM on `device` from dummy weights, sync a perturbed HF
    copy in place and generate greedily: (engine responses, HF responses, drift metrics), or the start-up
    refusal text for a family the engine cannot serve there."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from rlpost.rollout import build_rollout
    from rlpost.utils.tiny_model import build_tiny_model

    path = str(build_tiny_model(folder / name, arch=name, vocab_size=256))
    refused = engine_refusal(model_traits(AutoConfig.from_pretrained(path)), "vllm", device)
    if refused:
        return refused
    tok = AutoTokenizer.from_pretrained(path, padding_side="left")
    cfg = compose_config(*SMALL, "actor_rollout_ref.rollout.name=vllm", f"trainer.device={device}",
                         f"actor_rollout_ref.rollout.dtype={dtype}", "data.max_prompt_length=32",
                         f"data.max_response_length={R}", "actor_rollout_ref.rollout.calculate_log_probs=true",
                         "actor_rollout_ref.rollout.max_num_seqs=8",
                         *(["trainer.n_gpus_per_node=1", "actor_rollout_ref.rollout.gpu_memory_utilization=0.3",
                            "actor_rollout_ref.rollout.enforce_eager=true"] if device == "cuda" else [])
                         ).actor_rollout_ref.rollout
    assert cfg.load_format == "dummy_dtensor"  # the engine's own weights are random: only the sync sets them
    actor = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype),
                                                 attn_implementation=model_traits(AutoConfig.from_pretrained(path))
                                                 .attn_implementation).to(device).eval()
    _perturb(actor, seed=1, scale=sharpen)
    rollout = build_rollout(cfg, path, tok, device)
    try:
        rollout.update_weights(checkpoint_names(actor, actor.state_dict().items()))
        data = _batch(tok, ["What is 12 + 7?", "hi", "3 * 4 = 12. #### 12", "You are"])
        rollout.config = rollout.config.replace(ignore_eos=True)  # the typed copy the engine reads
        out = rollout.generate_sequences(data)
        ids, mask = data.batch[keys.INPUT_IDS].to(device), data.batch[keys.ATTENTION_MASK].to(device)
        with torch.no_grad():
            want = actor.generate(input_ids=ids, attention_mask=mask, max_new_tokens=R, do_sample=False,
                                  eos_token_id=None, pad_token_id=0)[:, ids.shape[1]:].cpu()
            logits = actor(input_ids=out.batch[keys.INPUT_IDS].to(device),
                           attention_mask=out.batch[keys.ATTENTION_MASK].to(device),
                           position_ids=out.batch[keys.POSITION_IDS].to(device)).logits.float().cpu()
        lp = torch.log_softmax(logits[:, ids.shape[1] - 1:-1], -1)
        actor_lp = lp.gather(-1, out.batch[keys.RESPONSES][..., None]).squeeze(-1)
        drift = rollout_probs_diff(out.batch[keys.ROLLOUT_LOG_PROBS], actor_lp, out.batch[keys.RESPONSE_MASK])
        return out.batch[keys.RESPONSES], want, drift
    finally:
        del rollout
        gc.collect()


@pytest.mark.parametrize("name", ENGINE_FAMILIES)
def test_sync_then_greedy_equals_hf(name, tmp_path):
    result = sync_and_generate(name, tmp_path, "cpu")
    assert isinstance(result, str) == (name in REFUSED_ON_CPU), result
    if isinstance(result, str):  # start-up stops it (tests/trainer/ppo/test_model_families_e2e.py runs one)
        assert "; set actor_rollout_ref.rollout.name=hf" in result and "vllm" in result
        return
    got, want, drift = result
    assert got.tolist() == want.tolist(), name
    assert drift["training/rollout_probs_diff_max"] < 1e-2, (name, drift)
