"""The GPU drivers' pure parts: generation batches, ratio and MFU bookkeeping, padded batches, the session summary."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest
import torch

from benchmarks import bench_padding, bench_realistic, harness, session_summary, workload
from rlpost import keys
from rlpost.rollout.utils import row_caps


def test_gen_batch_left_pads_and_carries_each_samples_cap() -> None:
    wl = workload.Workload(np.array([3, 5]), np.array([[4, 9], [2, 7]]), cap=16)
    prompts = [[11, 12, 13], [21, 22, 23, 24, 25]]
    batch = bench_realistic.gen_batch(argparse.Namespace(prompt_len=6, n=2), wl, prompts)
    assert batch.batch[keys.INPUT_IDS].tolist()[::2] == [[0, 0, 0, 11, 12, 13], [0, 21, 22, 23, 24, 25]]
    assert batch.batch[keys.POSITION_IDS][2].tolist() == [0, 0, 1, 2, 3, 4]
    assert row_caps(batch, max_tokens=16) == [4, 9, 2, 7]  # what the rollout will stop each row at
    assert batch.meta_info[keys.META_DO_SAMPLE] is True


def test_summarize_pairs_rounds_and_counts_mfu() -> None:
    rounds = [{"bare": {"gen_s": 2.0, "fwd_s": 1.0, "train_s": 3.0, "tokens": 1000, "gen_tokens": 800},
               "rlpost": {"gen": 2.0 * f, "old_log_prob": 1.25, "update_actor_only": 3.0, "tokens": 1000,
                          "step": 8.0, "update_weights": 0.1}} for f in (1.0,) * 12]
    res = harness.Result("realistic", "cmd", 12, env={"date": "2026-12-02", "gpu": "NVIDIA H200"})
    bench_realistic.summarize(res, rounds, params=989)
    assert res.goals["A3"]["value"] == pytest.approx(1.0) and res.goals["A3"]["met"] is True
    assert res.goals["A2_limit"]["value"] == pytest.approx(0.8) and res.goals["A2_limit"]["met"] is False
    # 6 x 989 params x 1000 tokens / 3 s / 989e12 = 2e-9; the forward 2 x 989 x 1000 / 1.25 / 989e12 = 1.6e-9.
    assert res.goals["A1"]["value"] == pytest.approx(2e-9) and res.goals["A2"]["value"] == pytest.approx(1.6e-9)
    assert res.metrics["rlpost_gen_tokens_per_s"]["value"] == pytest.approx(400.0)
    rounds[0]["bare"]["tokens"] = 1100
    with pytest.raises(AssertionError, match="different tokens"):
        bench_realistic.summarize(res, rounds, params=989)


def test_padded_batch_and_per_step_ratio() -> None:
    batch = bench_padding.batch_of([(2, 1), (3, 3)], prompt_len=3, response_len=3, vocab=50)
    assert batch.batch[keys.ATTENTION_MASK].tolist() == [[0, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]]
    assert batch.batch[keys.RESPONSE_MASK].tolist() == [[1, 0, 0], [1, 1, 1]]
    assert int((batch.batch[keys.INPUT_IDS] * (1 - batch.batch[keys.ATTENTION_MASK])).abs().sum()) == 0
    rounds = [{"padded": {"old_log_prob": 2.0, "update": 5.0}, "packed": {"old_log_prob": 1.0, "update": 3.0}}]
    realistic = {"rounds": [{"rlpost": {"step": s}} for s in (9.0, 10.0, 11.0)]}
    # median step 10 s; padded adds 2 x (2 - 1) + (5 - 3) = 4 s: 14 / 10.
    assert bench_padding.step_ratios(rounds, realistic) == [pytest.approx(1.4)]
    assert torch.equal(batch.batch[keys.POSITION_IDS][0], torch.tensor([0, 0, 1, 2, 2, 2]))


def test_session_summary_names_every_goal(tmp_path) -> None:
    res = harness.Result("realistic", "cmd", 12, env={"date": "2026-12-02T05:00:00", "gpu": "NVIDIA H200"})
    res.goal("A3", {"value": 0.97, "ci_low": 0.93, "ci_high": 1.01}, ">= 0.95, ci_low >= 0.90")
    folder = res.write(root=tmp_path).parent
    session_summary.main([str(folder), "--results", str(tmp_path / "elsewhere"), "--reason", "C3=verl not run"])
    goals = json.loads((folder / "summary.json").read_text())["goals"]
    assert set(session_summary.GOALS) <= set(goals) and goals["A3"]["met"] is True
    assert goals["C3"]["reason"] == "verl not run" and goals["C3"]["met"] is None
    assert goals["E2"]["reason"] == session_summary.REASONS["E2"]
    with pytest.raises(SystemExit):
        session_summary.main([str(folder), "--reason", "Z9=nope"])
