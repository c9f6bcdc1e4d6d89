"""Ulysses sequence parallelism over nccl on 2 GPUs: log-probs, entropy and gradients of a 0.5B-shaped layout
(14 query heads, 2 KV heads, head_dim 64; 2 layers) with SP 2 equal one GPU's on the same packed batch, in
float32 (SDPA's efficient kernel) and bfloat16 (the flash kernel, GQA without repeating KV heads)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from rlpost import keys

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workers"))
from _fsdp_helpers import spawn  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(300)]

VOCAB, ROWS, PROMPT, RESPONSE = 1024, 8, 96, 320


def _batch() -> dict[str, torch.Tensor]:
    """Left-padded prompts and right-padded responses of random lengths."""
    g = torch.Generator().manual_seed(0)
    p_len = torch.randint(8, PROMPT + 1, (ROWS,), generator=g)
    r_len = torch.randint(1, RESPONSE + 1, (ROWS,), generator=g)
    p_mask = (torch.arange(PROMPT)[None] >= (PROMPT - p_len)[:, None]).long()
    r_mask = (torch.arange(RESPONSE)[None] < r_len[:, None]).long()
    ids = torch.randint(3, VOCAB, (ROWS, PROMPT + RESPONSE), generator=g)
    attn = torch.cat([p_mask, r_mask], 1)
    ids = ids * attn
    return {keys.INPUT_IDS: ids, keys.ATTENTION_MASK: attn, keys.POSITION_IDS: (attn.cumsum(-1) - 1).clamp(min=0),
            keys.RESPONSES: ids[:, PROMPT:], keys.RESPONSE_MASK: r_mask}


def _values_and_grads(model, batch, sp):
    from rlpost.workers.actor import forward_response_logits, token_logp_entropy

    model.zero_grad(set_to_none=True)
    both = forward_response_logits(model, batch, True, lambda lg, lb: token_logp_entropy(lg, lb, 1.0, True), sp)
    weights = torch.linspace(-1.0, 1.0, both.numel(), device=both.device).reshape(both.shape)
    (both * weights * batch[keys.RESPONSE_MASK][..., None]).sum().backward()
    return both.detach().float(), {n: p.grad.float() for n, p in model.named_parameters()}


def _check(dtype: torch.dtype, sp, atol: float, rtol: float) -> None:
    import torch.distributed as dist
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from rlpost.engine.ulysses import use_ulysses_attention

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=VOCAB, hidden_size=896, intermediate_size=1024, num_hidden_layers=2,
                         num_attention_heads=14, num_key_value_heads=2, head_dim=64, tie_word_embeddings=True)
    model = Qwen2ForCausalLM(config).to("cuda", dtype)
    model.set_attn_implementation("sdpa")
    batch = {k: v.cuda() for k, v in _batch().items()}
    want, want_grads = _values_and_grads(model, batch, None)
    use_ulysses_attention(model, sp.size)
    got, grads = _values_and_grads(model, batch, sp)
    mask = batch[keys.RESPONSE_MASK].bool()
    torch.testing.assert_close(got[mask], want[mask], atol=atol, rtol=rtol)
    for name, grad in grads.items():
        dist.all_reduce(grad, group=sp.group)
        scale = want_grads[name].abs().max().clamp(min=1e-6)
        torch.testing.assert_close(grad / sp.size / scale, want_grads[name] / scale, atol=atol, rtol=rtol, msg=name)


def _worker(rank: int) -> None:
    from rlpost.utils.distributed import init_distributed
    from rlpost.engine.ulysses import new_sequence_parallel

    init_distributed("cuda")
    torch.backends.cuda.matmul.allow_tf32 = False
    sp = new_sequence_parallel(2)
    _check(torch.float32, sp, atol=1e-4, rtol=1e-4)
    _check(torch.bfloat16, sp, atol=3e-2, rtol=3e-2)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_sequence_parallel_over_nccl_matches_one_gpu(tmp_path):
    spawn(_worker, (), str(tmp_path), world=2)
