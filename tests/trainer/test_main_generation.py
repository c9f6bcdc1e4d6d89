"""Offline generation: config checks, prompt batching, parquet in/out with the HF and vLLM engines."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from omegaconf import OmegaConf

from rlpost import keys
from rlpost.trainer.main_generation import build_prompt_batch, check_generation_config, generate

REPO = Path(__file__).resolve().parents[2]

CHATS = [
    [{"role": "user", "content": "What is 1 + 2?"}],
    [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "What is 30 * 4?"}],
    [{"role": "user", "content": "What is 7 - 9? Answer with #### followed by the number."}],
]


def _write_prompts(tmp_path) -> Path:
    path = tmp_path / "prompts.parquet"
    pd.DataFrame({"prompt": CHATS, "data_source": ["arith"] * 3}).to_parquet(path)
    return path


def _overrides(model_dir: str, tmp_path, name: str = "hf") -> list[str]:
    """generation.yaml overrides for a tiny CPU run: 3 prompts in batches of 2, 2 samples, 8 tokens."""
    return [
        f"data.path={_write_prompts(tmp_path)}", "data.n_samples=2", "data.batch_size=2",
        f"data.output_path={tmp_path / 'out' / 'gen.parquet'}", f"model.path={model_dir}",
        f"rollout.name={name}", "rollout.prompt_length=64", "rollout.response_length=8", "rollout.max_num_seqs=64",
        "trainer.device=cpu", "trainer.n_gpus_per_node=1",
    ]


def _config(model_dir: str, tmp_path, name: str = "hf", **over) -> "OmegaConf":
    base = OmegaConf.load(REPO / "rlpost/trainer/config/generation.yaml")
    dotlist = _overrides(model_dir, tmp_path, name) + [f"{k}={v}" for k, v in over.items()]
    return OmegaConf.merge(base, OmegaConf.from_dotlist(dotlist))


def test_check_generation_config_errors(tiny_model_dir, tmp_path):
    check_generation_config(_config(tiny_model_dir, tmp_path))
    with pytest.raises(NotImplementedError, match="not supported yet: rollout.n"):
        check_generation_config(_config(tiny_model_dir, tmp_path, **{"rollout.n": 4}))
    check_generation_config(_config(tiny_model_dir, tmp_path, **{"trainer.n_gpus_per_node": 8}))
    with pytest.raises(ValueError, match=r"trainer.n_gpus_per_node=0: must be an integer >= 1; use trainer.n_gpus_per_node=1"):
        check_generation_config(_config(tiny_model_dir, tmp_path, **{"trainer.n_gpus_per_node": 0}))
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


@pytest.mark.timeout(200)
def test_generate_cli_hf_writes_n_responses_per_row(tiny_model_dir, tmp_path):
    cmd = [sys.executable, "-m", "rlpost.trainer.main_generation", *_overrides(tiny_model_dir, tmp_path)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = pd.read_parquet(tmp_path / "out" / "gen.parquet")
    assert len(out) == 3 and list(out.columns) == ["prompt", "data_source", "responses"]
    assert out["data_source"].tolist() == ["arith"] * 3
    assert [len(r) for r in out["responses"]] == [2, 2, 2]
    assert all(isinstance(s, str) for r in out["responses"] for s in r)
    assert out["prompt"][1][0]["content"] == "You are a helpful assistant."


def _hf_greedy(tiny_model_dir) -> list[str]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    out = []
    for chat in CHATS:
        text = tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
        ids = torch.tensor([tok(text, add_special_tokens=False)["input_ids"]])
        gen = model.generate(ids, max_new_tokens=8, do_sample=False, eos_token_id=tok.eos_token_id,
                             pad_token_id=tok.pad_token_id)
        out.append(tok.decode(gen[0, ids.shape[1] :], skip_special_tokens=True))
    return out


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


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_generate_across_two_ray_workers_matches_hf_greedy(tiny_model_dir, tmp_path):
    """trainer.n_gpus_per_node=2: one vLLM engine per Ray worker, prompts split between them (3 rows over
    2 workers: padding invisible), greedy output equal to transformers' own."""
    overrides = _overrides(tiny_model_dir, tmp_path, name="vllm")
    overrides = [o for o in overrides if not o.startswith("trainer.n_gpus_per_node")]
    cmd = [sys.executable, "-m", "rlpost.trainer.main_generation", *overrides, "trainer.n_gpus_per_node=2",
           "data.n_samples=1", "rollout.do_sample=false", "rollout.dtype=float32", "ray_init.num_cpus=2",
           "rollout.tensor_model_parallel_size=1"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = pd.read_parquet(tmp_path / "out" / "gen.parquet")
    assert [list(r) for r in out["responses"]] == [[t] for t in _hf_greedy(tiny_model_dir)]
