"""The workload through the user's path: the tiny GRPO example script on its parquet, each sample stopped at its cap."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from benchmarks import workload

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_example_script_stops_every_sample_at_its_own_cap(tiny_model_dir, tmp_path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    wl = workload.gsm8k_shaped(4, 4, cap=96, seed=0)  # one step of 4 prompts x 4, caps <= 96
    workload.write_parquet(wl, tok, tmp_path / "data" / "train.parquet")
    workload.write_parquet(wl, tok, tmp_path / "data" / "test.parquet")
    env = {**os.environ, "MODEL_PATH": str(tiny_model_dir), "DATA_DIR": str(tmp_path / "data"),
           "CKPT_DIR": str(tmp_path / "ckpt"), "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        ["bash", str(REPO / "examples" / "grpo_trainer" / "run_tiny_cpu.sh"), "data.max_prompt_length=192",
         "data.max_response_length=128", "actor_rollout_ref.rollout.ignore_eos=true", "data.shuffle=false",
         "trainer.total_training_steps=1", "trainer.test_freq=-1", "trainer.val_before_train=false",
         "trainer.save_freq=-1"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=560)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    metrics = json.loads((tmp_path / "ckpt" / "metrics.jsonl").read_text().splitlines()[0])
    # Without the caps a random model would run rows to 128 (only a sampled EOS shortens a row's mask).
    assert metrics["response_length/max"] <= float(np.max(wl.caps)) == 96.0
    assert metrics["response_length/clip_ratio"] == 0.0
    assert metrics["response_length/min"] <= float(np.min(wl.caps))  # the smallest cap, or an earlier EOS
