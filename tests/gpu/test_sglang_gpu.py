"""SGLang on GPU through `rlpost.rollout.sglang.SGLangRollout`, one engine for the module (the SGLang bundle of
docs/gpu.md on PYTHONPATH): weights synced from an HF model drive greedy decoding exactly as HF's forward does;
`sleep()` gives the device memory back (KV cache, and the weights in the actor's cycle) and the same
generation comes back after `wake_up()`; sampled log-probs stay within the drift bound of the actor's."""

from __future__ import annotations

import pytest
import torch

from engine_checks import (bf16_weights, check_drift, check_greedy_equals_hf,
                           check_sleep_frees_memory_and_wake_restores, engine_rollout_cfg)
from engine_checks import prompts as make_prompts
from rlpost import keys

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(400)]


@pytest.fixture(scope="module")
def engine(tiny_model_dir, hf_model):
    pytest.importorskip("sglang")
    from transformers import AutoTokenizer

    from rlpost.rollout import build_rollout

    rollout = build_rollout(engine_rollout_cfg("sglang"), tiny_model_dir,
                            AutoTokenizer.from_pretrained(tiny_model_dir), "cuda")
    rollout.update_weights(bf16_weights(hf_model))
    yield rollout
    rollout.shutdown()


def test_greedy_after_weight_sync_equals_hf(engine, hf_model):
    check_greedy_equals_hf(engine.generate_sequences(make_prompts(hf_model.config.vocab_size, False)), hf_model)


def test_rollout_vs_actor_drift_within_bound(engine, hf_model):
    check_drift(engine.generate_sequences(make_prompts(hf_model.config.vocab_size, True)), hf_model)


def test_sleep_frees_memory_and_wake_up_restores_generation(engine, hf_model):
    check_sleep_frees_memory_and_wake_restores(engine, hf_model.config.vocab_size)
    assert not engine.needs_sync  # no actor: the weights stayed


def test_released_weights_and_sync_restore_generation(engine, hf_model):
    """The worker's cycle with an actor present: sleep (weights released too) -> update_weights (wakes the
    weights only) -> wake_up (KV cache) gives the same greedy output as before the sleep."""
    prompts = make_prompts(hf_model.config.vocab_size, do_sample=False)
    before = engine.generate_sequences(prompts).batch[keys.RESPONSES]
    engine.release_weights = True
    try:
        free_awake, _ = torch.cuda.mem_get_info()
        engine.sleep()
        assert engine.needs_sync and torch.cuda.mem_get_info()[0] > free_awake
        with pytest.raises(RuntimeError, match="released its weights"):
            engine.wake_up()
        engine.update_weights(bf16_weights(hf_model))
        assert not engine.needs_sync and engine.sleeping  # the KV cache is still released
        engine.wake_up()
        after = engine.generate_sequences(prompts).batch[keys.RESPONSES]
    finally:
        engine.release_weights = False
    assert torch.equal(before, after)
