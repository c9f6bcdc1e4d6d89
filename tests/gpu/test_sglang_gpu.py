"""SGLang on GPU through `rlpost.rollout.sglang.SGLangRollout`, one engine for the module (the SGLang bundle of
docs/gpu.md on PYTHONPATH): weights synced from an HF model drive greedy decoding exactly as HF's forward does;
`sleep()` gives the device memory back (KV cache, and the weights in the actor's cycle) and the same
generation comes back after `wake_up()`; sampled log-probs stay within the drift bound of the actor's; the
multi-turn agent front (concurrent requests, next turns) decodes what the batch generation does."""

from __future__ import annotations

import asyncio

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


def test_agent_front_decodes_what_the_batch_does(engine, hf_model):
    """The multi-turn front: every prompt sent as its own request, all at once (greedy), comes back with the
    batch generation's tokens and a log-prob per token; a next turn sent while other requests still run
    (prompt + the first 8 response tokens) continues with the batch's remaining tokens."""
    from rlpost.rollout.async_engine import sampling_kwargs
    from rlpost.rollout.base import resolve_sampling

    prompts = make_prompts(hf_model.config.vocab_size, do_sample=False)
    batch = engine.generate_sequences(prompts).batch[keys.RESPONSES].tolist()
    params = sampling_kwargs(resolve_sampling(engine.config, prompts.meta_info))
    rows = prompts.batch[keys.INPUT_IDS].tolist()
    front = engine.agent_engine({0})

    async def conversations():
        async def two_turns(row):
            ids, log_probs = await front.generate(row, params)
            nxt, _ = await front.generate(row + ids[:8], {**params, "max_tokens": len(ids) - 8})
            return ids, log_probs, nxt
        try:
            return await asyncio.gather(*(two_turns(row) for row in rows))
        finally:
            await front.close()

    for (ids, log_probs, nxt), expected in zip(engine.run_coroutine(conversations()), batch):
        assert ids == expected and len(log_probs) == len(ids)
        assert nxt == expected[8:]
