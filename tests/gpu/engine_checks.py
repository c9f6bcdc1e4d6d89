"""What the GPU engine tests share: the sharpened tiny HF model, the prompts, HF's teacher-forced logits and
the rollout config of an engine test (tests/gpu/test_vllm_gpu.py, tests/gpu/test_sglang_gpu.py)."""

from __future__ import annotations

import torch

from rlpost import keys

B, P, R = 8, 12, 24
GPU_MEM = 0.3
DRIFT_MAX = 0.5  # trainer.rollout_drift_warn's default: the trainer warns above it


def sharpened_hf_model(model_dir: str) -> torch.nn.Module:
    """The tiny model with sharpened logits (embeddings x20: clear argmax margins), weights rounded to
    bf16 and held in fp32 so the reference sees exactly the engine's weights."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.no_grad():
        model.get_input_embeddings().weight.mul_(20.0)
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    return model.cuda().eval()


def engine_rollout_cfg(name: str, *extra: str):
    """`actor_rollout_ref.rollout` for one engine on one GPU: dummy weights (synced by the test), bf16, eager,
    free_cache_engine, rollout log-probs, ignore_eos (every response is R tokens long)."""
    from _compose import compose_config

    arr = "actor_rollout_ref"
    return compose_config(
        "trainer.device=cuda", "trainer.n_gpus_per_node=1", f"data.max_prompt_length={P}",
        f"data.max_response_length={R}", "data.train_batch_size=8", f"{arr}.actor.ppo_mini_batch_size=8",
        f"{arr}.actor.ppo_micro_batch_size_per_gpu=8", "critic.ppo_micro_batch_size_per_gpu=8",
        f"{arr}.rollout.name={name}", f"{arr}.rollout.dtype=bfloat16", f"{arr}.rollout.load_format=dummy_dtensor",
        f"{arr}.rollout.enforce_eager=true", f"{arr}.rollout.gpu_memory_utilization={GPU_MEM}",
        f"{arr}.rollout.free_cache_engine=true", f"{arr}.rollout.calculate_log_probs=true",
        f"{arr}.rollout.ignore_eos=true", f"{arr}.rollout.tensor_model_parallel_size=1",
        f"{arr}.rollout.max_num_seqs=64", f"{arr}.rollout.max_num_batched_tokens=2048", *extra,
    ).actor_rollout_ref.rollout


def bf16_weights(model: torch.nn.Module):
    """(name, bf16 tensor) pairs of `model`, as the worker's sync streams them."""
    return ((k, v.to(torch.bfloat16)) for k, v in model.state_dict().items())


def prompts(vocab: int, do_sample: bool):
    """B random prompts of P tokens (no padding), EOS and pad id 0."""
    from rlpost.protocol import DataProto

    ids = torch.randint(3, vocab, (B, P), generator=torch.Generator().manual_seed(1))
    return DataProto.from_dict(
        tensors={keys.INPUT_IDS: ids, keys.ATTENTION_MASK: torch.ones_like(ids),
                 keys.POSITION_IDS: torch.arange(P).expand(B, P).clone()},
        meta_info={keys.META_DO_SAMPLE: do_sample, keys.META_EOS_TOKEN_ID: 0, keys.META_PAD_TOKEN_ID: 0})


@torch.no_grad()
def hf_logits(model: torch.nn.Module, out) -> torch.Tensor:
    """(B, R, V) fp32 logits predicting each response token, teacher-forced on the engine's output."""
    ids = out.batch[keys.INPUT_IDS].cuda()
    return model(input_ids=ids, use_cache=False).logits[:, P - 1:-1].float()


def check_greedy_equals_hf(out, model: torch.nn.Module) -> None:
    """HF greedy continues from its own tokens; teacher-forcing on the engine's tokens is the same as long as
    they agree, so agreement everywhere == identical greedy outputs (near-ties within 0.05 logits allowed)."""
    responses = out.batch[keys.RESPONSES].cuda()
    assert responses.shape == (B, R)
    logits = hf_logits(model, out)
    agree = (logits.argmax(-1) == responses).float().mean().item()
    gap = (logits.max(-1).values - logits.gather(-1, responses[..., None]).squeeze(-1)).max().item()
    assert agree == 1.0 or gap < 0.05, f"agreement {agree:.3f}, worst logit gap {gap:.4f}"
    assert agree >= 0.98


def check_drift(out, model: torch.nn.Module) -> None:
    """The engine's sampled-token probabilities stay within the drift bound of HF's (temperature 1)."""
    from rlpost.rollout.drift import rollout_probs_diff

    responses = out.batch[keys.RESPONSES].cuda()
    actor = torch.log_softmax(hf_logits(model, out), -1).gather(-1, responses[..., None]).squeeze(-1)
    drift = rollout_probs_diff(out.batch[keys.ROLLOUT_LOG_PROBS].cuda(), actor, out.batch[keys.RESPONSE_MASK].cuda())
    assert drift["training/rollout_probs_diff_max"] < DRIFT_MAX, drift
    assert drift["training/rollout_probs_diff_mean"] < 0.02, drift


def check_sleep_frees_memory_and_wake_restores(engine, vocab: int) -> None:
    """`sleep()` gives back more than half of the engine's memory share (device-wide free memory, so it
    counts the engine's own processes too) and the same greedy output comes back after `wake_up()`."""
    batch = prompts(vocab, do_sample=False)
    before = engine.generate_sequences(batch).batch[keys.RESPONSES]
    engine.wake_up()
    free_awake, total = torch.cuda.mem_get_info()
    engine.sleep()
    freed = torch.cuda.mem_get_info()[0] - free_awake
    assert freed > 0.5 * GPU_MEM * total, f"sleep freed {freed / 2**30:.2f} GiB of {total / 2**30:.0f} GiB"
    engine.wake_up()
    assert torch.equal(before, engine.generate_sequences(batch).batch[keys.RESPONSES])
