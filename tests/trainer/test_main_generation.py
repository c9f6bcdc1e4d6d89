"""Offline generation: config checks, prompt batching, parquet in/out with the HF and vLLM engines."""

import numpy as np
import pandas as pd
import pytest
import torch
from omegaconf import OmegaConf

from rlpost import keys
from rlpost.trainer.main_generation import build_prompt_batch, check_generation_config, generate

CHATS = [
    [{"role": "user", "content": "What is 1 + 2?"}],
    [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "What is 30 * 4?"}],
    [{"role": "user", "content": "What is 7 - 9? Answer with #### followed by the number."}],
]


def _config(model_dir: str, tmp_path, name: str = "hf", **over) -> "OmegaConf":
    path = tmp_path / "prompts.parquet"
    pd.DataFrame({"prompt": CHATS, "data_source": ["arith"] * 3}).to_parquet(path)
    cfg = OmegaConf.create({
        "trainer": {"nnodes": 1, "n_gpus_per_node": 1},
        "data": {"path": str(path), "prompt_key": "prompt", "n_samples": 2, "batch_size": 2,
                 "output_path": str(tmp_path / "out" / "gen.parquet")},
        "model": {"path": model_dir, "external_lib": None},
        "rollout": {"name": name, "mode": "sync", "temperature": 1.0, "top_k": 50, "top_p": 0.7,
                    "prompt_length": 64, "response_length": 8, "dtype": "bfloat16", "gpu_memory_utilization": 0.5,
                    "ignore_eos": False, "enforce_eager": True, "free_cache_engine": True,
                    "load_format": "dummy_dtensor", "tensor_model_parallel_size": 1, "max_num_batched_tokens": 8192,
                    "max_num_seqs": 64, "do_sample": True, "n": 1, "calculate_log_probs": False},
    })
    return OmegaConf.merge(cfg, OmegaConf.from_dotlist([f"{k}={v}" for k, v in over.items()]))


def test_check_generation_config_errors(tiny_model_dir, tmp_path):
    check_generation_config(_config(tiny_model_dir, tmp_path))
    with pytest.raises(NotImplementedError, match="not supported yet: rollout.n"):
        check_generation_config(_config(tiny_model_dir, tmp_path, **{"rollout.n": 4}))
    with pytest.raises(NotImplementedError, match="not supported yet: trainer.nnodes"):
        check_generation_config(_config(tiny_model_dir, tmp_path, **{"trainer.nnodes": 2}))
    with pytest.raises(ValueError, match="identical responses"):
        check_generation_config(_config(tiny_model_dir, tmp_path, **{"rollout.temperature": 0}))


def test_build_prompt_batch_left_pads(tiny_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    batch = build_prompt_batch(CHATS[:2], tok, max_prompt_length=64)
    ids, mask, pos = (batch.batch[k] for k in (keys.INPUT_IDS, keys.ATTENTION_MASK, keys.POSITION_IDS))
    texts = [tok.apply_chat_template(c, add_generation_prompt=True, tokenize=False) for c in CHATS[:2]]
    lengths = [len(tok(t, add_special_tokens=False)["input_ids"]) for t in texts]
    assert ids.shape == (2, max(lengths)) and mask.sum(-1).tolist() == lengths
    short = int(np.argmin(lengths))
    assert (ids[short, : max(lengths) - lengths[short]] == tok.pad_token_id).all()
    assert pos[short, -1].item() == lengths[short] - 1
    assert batch.meta_info[keys.META_EOS_TOKEN_ID] == tok.eos_token_id
    text = tok.decode(ids[short][mask[short].bool()])
    assert text == tok.apply_chat_template(CHATS[short], add_generation_prompt=True, tokenize=False)
    with pytest.raises(ValueError, match="rollout.prompt_length=4"):
        build_prompt_batch(CHATS[:1], tok, max_prompt_length=4)


def test_generate_hf_writes_n_responses_per_row(tiny_model_dir, tmp_path):
    cfg = _config(tiny_model_dir, tmp_path)
    generate(cfg)
    out = pd.read_parquet(cfg.data.output_path)
    assert len(out) == 3 and list(out.columns) == ["prompt", "data_source", "responses"]
    assert out["data_source"].tolist() == ["arith"] * 3
    assert [len(r) for r in out["responses"]] == [2, 2, 2]
    assert all(isinstance(s, str) for r in out["responses"] for s in r)
    assert out["prompt"][1][0]["content"] == "You are a helpful assistant."


def test_generate_hf_greedy_matches_transformers(tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cfg = _config(tiny_model_dir, tmp_path, **{"data.n_samples": 1, "rollout.do_sample": False})
    got = generate(cfg)["responses"].tolist()
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    for chat, responses in zip(CHATS, got):
        text = tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
        ids = torch.tensor([tok(text, add_special_tokens=False)["input_ids"]])
        gen = model.generate(ids, max_new_tokens=8, do_sample=False, eos_token_id=tok.eos_token_id,
                             pad_token_id=tok.pad_token_id)
        assert list(responses) == [tok.decode(gen[0, ids.shape[1] :], skip_special_tokens=True)]


@pytest.mark.e2e
@pytest.mark.timeout(280)
def test_generate_vllm_writes_n_responses_per_row(tiny_model_dir, tmp_path):
    cfg = _config(tiny_model_dir, tmp_path, name="vllm", **{"data.n_samples": 3})
    generate(cfg)
    out = pd.read_parquet(cfg.data.output_path)
    assert len(out) == 3 and [len(r) for r in out["responses"]] == [3, 3, 3]
    assert all(isinstance(s, str) for r in out["responses"] for s in r)
