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

from rlpost import keys  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(280)]

B, P, R = 8, 12, 24
GPU_MEM = 0.3
DRIFT_MAX = 0.5  # trainer.rollout_drift_warn's default: the trainer warns above it


@pytest.fixture(scope="module")
def hf_model(tiny_model_dir):
    """The tiny model with sharpened logits (embeddings x20: clear argmax margins), weights rounded to
    bf16 and held in fp32 so the reference sees exactly the engine's weights."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    with torch.no_grad():
        model.get_input_embeddings().weight.mul_(20.0)
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    return model.cuda().eval()


@pytest.fixture(scope="module")
def engine(tiny_model_dir, hf_model):
    from transformers import AutoTokenizer

    from rlpost.rollout import build_rollout

    from _compose import compose_config

    arr = "actor_rollout_ref"
    cfg = compose_config(
        "trainer.device=cuda", "trainer.n_gpus_per_node=1", f"data.max_prompt_length={P}",
        f"data.max_response_length={R}", "data.train_batch_size=8", f"{arr}.actor.ppo_mini_batch_size=8",
        f"{arr}.actor.ppo_micro_batch_size_per_gpu=8", "critic.ppo_micro_batch_size_per_gpu=8",
        f"{arr}.rollout.name=vllm", f"{arr}.rollout.dtype=bfloat16", f"{arr}.rollout.load_format=dummy_dtensor",
        f"{arr}.rollout.enforce_eager=true", f"{arr}.rollout.gpu_memory_utilization={GPU_MEM}",
        f"{arr}.rollout.free_cache_engine=true", f"{arr}.rollout.calculate_log_probs=true",
        f"{arr}.rollout.ignore_eos=true", f"{arr}.rollout.tensor_model_parallel_size=1",
        f"{arr}.rollout.max_num_seqs=64", f"{arr}.rollout.max_num_batched_tokens=2048",
    ).actor_rollout_ref.rollout
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    rollout = build_rollout(cfg, tiny_model_dir, tok, "cuda")
    rollout.update_weights((k, v.to(torch.bfloat16)) for k, v in hf_model.state_dict().items())
    yield rollout
    del rollout


def _prompts(vocab: int, do_sample: bool):
    from rlpost.protocol import DataProto

    ids = torch.randint(3, vocab, (B, P), generator=torch.Generator().manual_seed(1))
    return DataProto.from_dict(
        tensors={keys.INPUT_IDS: ids, keys.ATTENTION_MASK: torch.ones_like(ids),
                 keys.POSITION_IDS: torch.arange(P).expand(B, P).clone()},
        meta_info={keys.META_DO_SAMPLE: do_sample, keys.META_EOS_TOKEN_ID: 0, keys.META_PAD_TOKEN_ID: 0})


@torch.no_grad()
def _hf_logits(model, out) -> torch.Tensor:
    """(B, R, V) fp32 logits predicting each response token, teacher-forced on the engine's output."""
    ids = out.batch[keys.INPUT_IDS].cuda()
    return model(input_ids=ids, use_cache=False).logits[:, P - 1:-1].float()


def test_greedy_after_weight_sync_equals_hf(engine, hf_model):
    out = engine.generate_sequences(_prompts(hf_model.config.vocab_size, do_sample=False))
    responses = out.batch[keys.RESPONSES].cuda()
    assert responses.shape == (B, R)
    logits = _hf_logits(hf_model, out)
    hf_argmax = logits.argmax(-1)
    # HF greedy continues from its own tokens; teacher-forcing on the engine's tokens is the same as long
    # as they agree, so agreement everywhere == identical greedy outputs.
    agree = (hf_argmax == responses).float().mean().item()
    gap = (logits.max(-1).values - logits.gather(-1, responses[..., None]).squeeze(-1)).max().item()
    assert agree == 1.0 or gap < 0.05, f"agreement {agree:.3f}, worst logit gap {gap:.4f}"
    assert agree >= 0.98


def test_sleep_frees_memory_and_wake_up_restores_generation(engine, hf_model):
    prompts = _prompts(hf_model.config.vocab_size, do_sample=False)
    before = engine.generate_sequences(prompts).batch[keys.RESPONSES]
    engine.wake_up()
    free_awake, total = torch.cuda.mem_get_info()
    engine.sleep()
    free_asleep, _ = torch.cuda.mem_get_info()
    freed = free_asleep - free_awake
    assert freed > 0.5 * GPU_MEM * total, f"sleep freed {freed / 2**30:.2f} GiB of {total / 2**30:.0f} GiB"
    engine.wake_up()
    after = engine.generate_sequences(prompts).batch[keys.RESPONSES]
    assert torch.equal(before, after)


def test_rollout_vs_actor_drift_within_bound(engine, hf_model):
    from rlpost.rollout.drift import rollout_probs_diff

    out = engine.generate_sequences(_prompts(hf_model.config.vocab_size, do_sample=True))
    responses = out.batch[keys.RESPONSES].cuda()
    actor = torch.log_softmax(_hf_logits(hf_model, out), -1).gather(-1, responses[..., None]).squeeze(-1)
    drift = rollout_probs_diff(out.batch[keys.ROLLOUT_LOG_PROBS].cuda(), actor, out.batch[keys.RESPONSE_MASK].cuda())
    assert drift["training/rollout_probs_diff_max"] < DRIFT_MAX, drift
    assert drift["training/rollout_probs_diff_mean"] < 0.02, drift


def test_level2_sleep_drops_weights_and_sync_restores_generation(engine, hf_model):
    """The worker's cycle with an actor present: sleep(level 2) -> update_weights (wakes the weights
    only) -> wake_up (KV cache) gives the same greedy output as before the sleep."""
    prompts = _prompts(hf_model.config.vocab_size, do_sample=False)
    before = engine.generate_sequences(prompts).batch[keys.RESPONSES]
    engine.sleep_level = 2
    try:
        engine.sleep()
        assert engine.needs_sync
        with pytest.raises(RuntimeError, match="level-2 sleep"):
            engine.wake_up()
        engine.update_weights((k, v.to(torch.bfloat16)) for k, v in hf_model.state_dict().items())
        assert not engine.needs_sync and engine.sleeping  # the KV cache is still released
        engine.wake_up()
        after = engine.generate_sequences(prompts).batch[keys.RESPONSES]
    finally:
        engine.sleep_level = 1
    assert torch.equal(before, after)
