"""`forward_response_logits` (LM head on response positions only) and `token_logp_entropy` against the
plain full-logits computation, on CPU with the tiny model."""

from __future__ import annotations

import pytest
import torch

from rlpost import keys
from rlpost.algos.logits import entropy_from_logits, logprobs_from_logits
from rlpost.workers.actor import _response_positions, forward_response_logits, token_logp_entropy
from _fsdp_helpers import make_batch


def test_token_logp_entropy_matches_reference_in_chunks():
    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(7, 11, generator=g) * 3).to(torch.bfloat16)
    labels = torch.randint(0, 11, (7,), generator=g)
    out = token_logp_entropy(logits, labels, temperature=0.7, with_entropy=True, chunk=3)
    z = logits.float() / 0.7
    assert out.shape == (7, 2) and out.dtype == torch.float32
    torch.testing.assert_close(out[:, 0], logprobs_from_logits(z, labels))
    torch.testing.assert_close(out[:, 1], entropy_from_logits(z))
    only = token_logp_entropy(logits, labels, temperature=0.7, chunk=4)
    assert only.shape == (7, 1)
    torch.testing.assert_close(only[:, 0], out[:, 0])


def test_token_logp_entropy_with_autograd_matches_and_has_the_reference_gradient():
    """Training goes through log_softmax, forward-only through logsumexp: same values, right gradient."""
    g = torch.Generator().manual_seed(1)
    base = torch.randn(9, 13, generator=g) * 3
    labels = torch.randint(0, 13, (9,), generator=g)
    weight = torch.randn(9, 2, generator=g)
    with torch.no_grad():
        no_grad = token_logp_entropy(base, labels, temperature=0.7, with_entropy=True, chunk=4)
    logits = base.clone().requires_grad_(True)
    out = token_logp_entropy(logits, labels, temperature=0.7, with_entropy=True, chunk=4)
    torch.testing.assert_close(out, no_grad)
    (out * weight).sum().backward()
    ref_logits = base.clone().requires_grad_(True)
    z = ref_logits / 0.7
    ref = torch.stack([logprobs_from_logits(z, labels), entropy_from_logits(z)], dim=-1)
    (ref * weight).sum().backward()
    torch.testing.assert_close(logits.grad, ref_logits.grad)


def test_response_positions_pick_real_tokens_before_each_response_token():
    mask = torch.tensor([[0, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1]])
    keep, grid = _response_positions(mask, r=3)
    # positions 2..4 predict the 3 response tokens; row 0's position 5 is pad (not a predicting one anyway)
    assert grid.tolist() == [2, 3, 4, 8, 9, 10]
    assert keep.tolist() == [1, 2, 3, 6, 7, 8]  # row 0 has 4 real tokens, packed first


class _NoKeep(torch.nn.Module):
    """A model whose forward has no `logits_to_keep` (like a token-classification critic)."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, input_ids, attention_mask=None, position_ids=None, use_cache=False):
        return self.inner(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                          use_cache=use_cache)


@pytest.mark.parametrize("rmpad", [False, True])
def test_head_on_response_positions_equals_full_logits(tiny_model_dir, rmpad):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    mb = make_batch(model.config.vocab_size)

    def fn(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return token_logp_entropy(logits, labels, 0.7, with_entropy=True)

    with torch.no_grad():
        fast = forward_response_logits(model, mb, rmpad, fn)
        full = forward_response_logits(_NoKeep(model), mb, rmpad, fn)
        padded = forward_response_logits(_NoKeep(model), mb, False, fn)
    assert fast.shape == (8, 5, 2)
    real = mb[keys.RESPONSE_MASK].bool()
    torch.testing.assert_close(fast[real], full[real], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(fast[real], padded[real], atol=1e-4, rtol=1e-4)


def test_sum_pi_squared_is_the_tempered_distributions_and_needs_no_autograd():
    g = torch.Generator().manual_seed(1)
    logits = (torch.randn(7, 11, generator=g) * 3).to(torch.bfloat16)
    labels = torch.randint(0, 11, (7,), generator=g)
    out = token_logp_entropy(logits, labels, temperature=0.7, chunk=3, with_sum_pi_squared=True)
    probs = torch.softmax(logits.float() / 0.7, dim=-1)
    assert out.shape == (7, 3)
    torch.testing.assert_close(out[:, 0], probs.log().gather(-1, labels[:, None]).squeeze(-1))
    assert torch.equal(out[:, 1], torch.zeros(7))  # entropy not asked for
    torch.testing.assert_close(out[:, 2], (probs ** 2).sum(-1))
    both = token_logp_entropy(logits, labels, temperature=0.7, with_entropy=True, with_sum_pi_squared=True)
    torch.testing.assert_close(both[:, 1], entropy_from_logits(logits.float() / 0.7))
    with pytest.raises(ValueError, match="without autograd"):
        token_logp_entropy(logits.float().requires_grad_(), labels, with_sum_pi_squared=True)


def test_actor_log_prob_stats_add_sum_pi_squared_on_packed_rows(tiny_model_dir):
    """`compute_log_prob_stats` with the statistic: the same log-probs and entropies as without it (padded and
    packed rows), and sum p^2 of the model's own next-token distributions, with the fused head configured."""
    from types import SimpleNamespace

    from transformers import AutoModelForCausalLM

    from rlpost.protocol import DataProto
    from rlpost.workers.actor import DataParallelPPOActor

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    mb = make_batch(model.config.vocab_size)
    config = SimpleNamespace(entropy_from_logits_with_chunking=False, entropy_from_logits_chunk_size=2048,
                             use_torch_compile=False, entropy_checkpointing=False)
    data = DataProto.from_dict(tensors={k: mb[k] for k in (keys.INPUT_IDS, keys.ATTENTION_MASK, keys.POSITION_IDS,
                                                           keys.RESPONSES)},
                               meta_info={"micro_batch_size": 3, keys.META_TEMPERATURE: 1.0})
    for rmpad in (False, True):
        actor = DataParallelPPOActor(config, model, use_remove_padding=rmpad, use_fused_kernels=True)
        stats = actor.compute_log_prob_stats(data, calculate_entropy=True, calculate_sum_pi_squared=True)
        logp, ent = actor.compute_log_prob(data, calculate_entropy=True)
        real = mb[keys.RESPONSE_MASK].bool()
        torch.testing.assert_close(stats[keys.OLD_LOG_PROBS][real], logp[real], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(stats[keys.ENTROPYS][real], ent[real], atol=1e-5, rtol=1e-5)
        with torch.no_grad():
            logits = model(input_ids=mb[keys.INPUT_IDS], attention_mask=mb[keys.ATTENTION_MASK],
                           position_ids=mb[keys.POSITION_IDS]).logits
        r = mb[keys.RESPONSES].shape[1]
        want = (torch.softmax(logits[:, -r - 1:-1].float(), -1) ** 2).sum(-1)
        torch.testing.assert_close(stats[keys.SUM_PI_SQUARED][real], want[real], atol=1e-5, rtol=1e-5)


@pytest.mark.timeout(60)
def test_lora_actor_packed_fused_token_budget_log_probs_match_a_plain_peft_forward(tiny_model_dir):
    """The settings goal E2's LoRA run uses (packed rows, the fused head, micro-batches by token budget), on a PEFT
    model: log-probs with the adapter on, and with it off (the reference), equal a padded full-logits forward of
    the PEFT model, and of the base model alone."""
    from types import SimpleNamespace

    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from rlpost.protocol import DataProto
    from rlpost.workers.actor import DataParallelPPOActor

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    plain = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    peft = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", lora_dropout=0.0))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in peft.named_parameters():
            if ".lora_B." in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    model = peft.base_model.model
    mb = make_batch(model.config.vocab_size)
    config = SimpleNamespace(entropy_from_logits_with_chunking=False, entropy_from_logits_chunk_size=2048,
                             use_torch_compile=False, entropy_checkpointing=False)
    tokens = int(mb[keys.ATTENTION_MASK].sum())
    data = DataProto.from_dict(tensors={k: mb[k] for k in (keys.INPUT_IDS, keys.ATTENTION_MASK, keys.POSITION_IDS,
                                                           keys.RESPONSES)},
                               meta_info={"micro_batch_size": 2, "use_dynamic_bsz": True,
                                          "max_token_len": tokens // 2 + 1, keys.META_TEMPERATURE: 1.0})
    actor = DataParallelPPOActor(config, model, use_remove_padding=True, use_fused_kernels=True)
    real = mb[keys.RESPONSE_MASK].bool()
    r = mb[keys.RESPONSES].shape[1]

    def want(m: torch.nn.Module) -> torch.Tensor:
        with torch.no_grad():
            logits = m(input_ids=mb[keys.INPUT_IDS], attention_mask=mb[keys.ATTENTION_MASK],
                       position_ids=mb[keys.POSITION_IDS]).logits[:, -r - 1:-1]
        return torch.log_softmax(logits.float(), -1).gather(-1, mb[keys.RESPONSES][..., None])[..., 0]

    on, _ = actor.compute_log_prob(data, calculate_entropy=False)
    torch.testing.assert_close(on[real], want(model)[real], atol=1e-5, rtol=1e-5)
    with peft.disable_adapter():
        off, _ = actor.compute_log_prob(data, calculate_entropy=False)
    torch.testing.assert_close(off[real], want(plain)[real], atol=1e-5, rtol=1e-5)
    assert (on[real] - off[real]).abs().max() > 1e-2  # the adapter moves the log-probs: both checks mean something
