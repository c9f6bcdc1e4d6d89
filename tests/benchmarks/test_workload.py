"""The GSM8K-shaped workload: seeded distributions, step slices, and a parquet file rlpost's dataset reads as drawn."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks import workload


def test_distributions_are_seeded_and_shaped_like_gsm8k() -> None:
    wl = workload.gsm8k_shaped(4096, 8, cap=1024, seed=3)
    again = workload.gsm8k_shaped(4096, 8, cap=1024, seed=3)
    assert np.array_equal(wl.prompt_lens, again.prompt_lens) and np.array_equal(wl.caps, again.caps)
    assert not np.array_equal(wl.caps, workload.gsm8k_shaped(4096, 8, seed=4).caps)
    assert wl.prompt_lens.min() >= 70 and wl.prompt_lens.max() <= 190
    assert 100 <= np.median(wl.prompt_lens) <= 120
    caps = wl.caps.ravel()
    assert caps.min() >= 16 and caps.max() == 1024
    assert 225 <= caps.mean() <= 255  # log-normal body (mean ~216) plus 3 % run-aways at the cap
    assert 0.025 <= np.mean(caps == 1024) <= 0.035
    assert np.median(caps) < caps.mean()  # long right tail
    with pytest.raises(ValueError, match="cap=8 is below the shortest response"):
        workload.gsm8k_shaped(1, 1, cap=8)


def test_step_slices_and_rows_are_prompt_major() -> None:
    wl = workload.gsm8k_shaped(6, 2, cap=64, seed=0)
    second = wl.step(1, 2)
    assert np.array_equal(second.prompt_lens, wl.prompt_lens[2:4]) and second.caps.shape == (2, 2)
    assert second.rows() == [(int(wl.prompt_lens[2]), int(wl.caps[2, 0])), (int(wl.prompt_lens[2]), int(wl.caps[2, 1])),
                             (int(wl.prompt_lens[3]), int(wl.caps[3, 0])), (int(wl.prompt_lens[3]), int(wl.caps[3, 1]))]
    ids = workload.token_prompts(wl, vocab=500, seed=0)
    assert [len(p) for p in ids] == wl.prompt_lens.tolist() and all(10 <= t < 500 for p in ids for t in p)


def test_parquet_reads_back_with_its_lengths_and_caps(tiny_model_dir, tmp_path) -> None:
    from transformers import AutoTokenizer

    from _compose import SMALL, compose_config
    from rlpost import keys
    from rlpost.data import RLHFDataset

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    wl = workload.gsm8k_shaped(4, 3, cap=300, seed=1)
    path = workload.write_parquet(wl, tok, tmp_path / "train.parquet")
    cfg = compose_config(*SMALL, "actor_rollout_ref.rollout.name=hf", "data.max_prompt_length=200").data
    ds = RLHFDataset(str(path), tok, cfg)
    for i in range(4):
        n = int(ds[i][keys.ATTENTION_MASK].sum())
        assert wl.prompt_lens[i] - 12 <= n <= wl.prompt_lens[i]  # the longest word prefix that fits
        assert ds[i][keys.RESPONSE_CAPS] == wl.caps[i].tolist()
        assert ds[i][keys.DATA_SOURCE] == "openai/gsm8k"
