"""The actor's top-k pass (`DataParallelPPOActor.compute_topk` / `_topk_forward`, top-k distillation) against
the tiny model's full next-token distributions, computed directly."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from rlpost import keys
from rlpost.protocol import DataProto
from _fsdp_helpers import make_batch

CONFIG = SimpleNamespace(entropy_from_logits_with_chunking=False, entropy_from_logits_chunk_size=2048,
                         use_torch_compile=False, entropy_checkpointing=False)
INPUTS = (keys.INPUT_IDS, keys.ATTENTION_MASK, keys.POSITION_IDS, keys.RESPONSES)


def _full_log_probs(model, mb, temperature):
    with torch.no_grad():
        logits = model(input_ids=mb[keys.INPUT_IDS], attention_mask=mb[keys.ATTENTION_MASK],
                       position_ids=mb[keys.POSITION_IDS]).logits
    r = mb[keys.RESPONSES].shape[1]
    return torch.log_softmax(logits[:, -r - 1:-1].float() / temperature, dim=-1)


@pytest.mark.timeout(60)
def test_compute_topk_matches_the_full_distribution_in_micro_batches(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    from rlpost.workers.actor import DataParallelPPOActor

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    mb = make_batch(model.config.vocab_size)
    full = _full_log_probs(model, mb, 0.7)
    g = torch.Generator().manual_seed(0)
    at = torch.randint(0, model.config.vocab_size, (*mb[keys.RESPONSES].shape, 6), generator=g)
    data = DataProto.from_dict(tensors={k: mb[k] for k in INPUTS},
                               meta_info={"micro_batch_size": 3, keys.META_TEMPERATURE: 0.7})
    out = DataParallelPPOActor(CONFIG, model, use_remove_padding=True).compute_topk(data, 4, at)
    real = mb[keys.RESPONSE_MASK].bool()
    want_lp, want_ids = full.topk(4, dim=-1)
    assert out["topk_ids"].shape == (8, 5, 4) and out["at_ids"].shape == (8, 5, 6)
    assert torch.equal(out["topk_ids"][real], want_ids[real])
    torch.testing.assert_close(out["topk_log_probs"][real], want_lp[real], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out["at_ids"][real], full.gather(-1, at)[real], atol=1e-5, rtol=1e-5)
    sampled = full.gather(-1, mb[keys.RESPONSES][..., None]).squeeze(-1)
    torch.testing.assert_close(out[keys.OLD_LOG_PROBS][real], sampled[real], atol=1e-5, rtol=1e-5)


@pytest.mark.timeout(60)
def test_topk_forward_gives_the_support_log_probs_a_gradient(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    from rlpost.workers.actor import DataParallelPPOActor

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    mb = make_batch(model.config.vocab_size)
    at = torch.arange(8)[None, None].expand(8, 5, 8).contiguous()
    out = DataParallelPPOActor(CONFIG, model)._topk_forward(mb, 1.0, 0, at, calculate_entropy=True)
    assert out["at_ids"].requires_grad and out[keys.ENTROPYS].shape == (8, 5)
    out["at_ids"].exp().sum().backward()
    assert model.lm_head.weight.grad is not None and model.lm_head.weight.grad.abs().sum() > 0
