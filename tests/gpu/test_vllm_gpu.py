"""vLLM on GPU through `rlpost.rollout.vllm.VLLMRollout`, one engine for the module (start-up costs ~30 s):
weights synced from an HF model drive greedy decoding exactly as HF's forward does; `sleep()` gives the
device memory back and `wake_up()` restores the same generation; sampled log-probs stay within the drift
bound of the actor's."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")

from engine_checks import (bf16_weights, check_drift, check_greedy_equals_hf,  # noqa: E402
                           check_sleep_frees_memory_and_wake_restores, engine_rollout_cfg)
from engine_checks import prompts as make_prompts  # noqa: E402
from rlpost import keys  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(280)]


@pytest.fixture(scope="module")
def engine(tiny_model_dir, hf_model):
    from transformers import AutoTokenizer

    from rlpost.rollout import build_rollout

    rollout = build_rollout(engine_rollout_cfg("vllm"), tiny_model_dir, AutoTokenizer.from_pretrained(tiny_model_dir),
                            "cuda")
    rollout.update_weights(bf16_weights(hf_model))
    yield rollout
    del rollout


def test_greedy_after_weight_sync_equals_hf(engine, hf_model):
    check_greedy_equals_hf(engine.generate_sequences(make_prompts(hf_model.config.vocab_size, do_sample=False)), hf_model)


def test_sleep_frees_memory_and_wake_up_restores_generation(engine, hf_model):
    check_sleep_frees_memory_and_wake_restores(engine, hf_model.config.vocab_size)


def test_rollout_vs_actor_drift_within_bound(engine, hf_model):
    check_drift(engine.generate_sequences(make_prompts(hf_model.config.vocab_size, do_sample=True)), hf_model)


def test_level2_sleep_drops_weights_and_sync_restores_generation(engine, hf_model):
    """The worker's cycle with an actor present: sleep(level 2) -> update_weights (wakes the weights
    only) -> wake_up (KV cache) gives the same greedy output as before the sleep."""
    prompts = make_prompts(hf_model.config.vocab_size, do_sample=False)
    before = engine.generate_sequences(prompts).batch[keys.RESPONSES]
    engine.sleep_level = 2
    try:
        engine.sleep()
        assert engine.needs_sync
        with pytest.raises(RuntimeError, match="level-2 sleep"):
            engine.wake_up()
        engine.update_weights(bf16_weights(hf_model))
        assert not engine.needs_sync and engine.sleeping  # the KV cache is still released
        engine.wake_up()
        after = engine.generate_sequences(prompts).batch[keys.RESPONSES]
    finally:
        engine.sleep_level = 1
    assert torch.equal(before, after)


def test_phase_peak_leaves_out_the_sleeping_engine_pool(engine):
    """The allocator still counts a sleeping engine's pool as allocated; the phase peak does not."""
    from rlpost.rollout.vllm import sleeping_pool_bytes
    from rlpost.utils.profiler import drain_phase_peaks, phase

    engine.wake_up()
    engine.sleep()
    unbacked = sleeping_pool_bytes()
    assert unbacked > 2**30  # the tiny model's KV cache share alone is GiBs
    try:
        drain_phase_peaks()
        counted = torch.cuda.memory_allocated()

        @phase("update_actor")
        def train_like() -> None:
            x = torch.empty(2**30, dtype=torch.uint8, device="cuda")
            del x

        train_like()
        peak = drain_phase_peaks()["perf/max_memory_allocated_gb/update_actor"]
        assert peak == pytest.approx((counted - unbacked) / 2**30 + 1.0, abs=0.05)
    finally:
        engine.wake_up()
