"""benchmarks/bench_gen_ablate.py: the "rlpost" engine is built from exactly the kwargs the rollout passes."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_gen_ablate  # noqa: E402

pytestmark = pytest.mark.timeout(120)


def test_rlpost_engine_kwargs_follow_the_gpu_example_and_the_overrides(tmp_path):
    kwargs = bench_gen_ablate.rlpost_kwargs(tmp_path, [])
    assert kwargs["model"] == str(tmp_path)
    # the GPU example's rollout settings at gpu_grpo_e2e.sh's 512 + 512, and what the config derives from them
    assert (kwargs["gpu_memory_utilization"], kwargs["max_num_batched_tokens"], kwargs["enforce_eager"]) == (
        0.6, 16384, False)
    assert kwargs["max_model_len"] == 1024 and kwargs["tensor_parallel_size"] == 1
    assert kwargs["enable_sleep_mode"] is True and kwargs["logprobs_mode"] == "processed_logprobs"
    smaller = bench_gen_ablate.rlpost_kwargs(tmp_path, ["actor_rollout_ref.rollout.max_model_len=540"])
    assert smaller["max_model_len"] == 540


def test_engine_choice_is_checked_by_the_parser():
    args = bench_gen_ablate.parse_args(["--model-dir", "/m", "--engines", "rlpost", "--override", "a=1"])
    assert args.engines == ["rlpost"] and args.override == ["a=1"] and args.prompt_len == 28
    with pytest.raises(SystemExit):
        bench_gen_ablate.parse_args(["--model-dir", "/m", "--engines", "sglang"])
