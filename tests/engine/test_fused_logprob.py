"""Fused LM head + log-prob/entropy equals the unfused head + `token_logp_entropy` (values and gradients, fp32);
entropy checkpointing and smaller chunks give the same gradients; a failing torch.compile falls back to eager."""

from __future__ import annotations

import logging

import pytest
import torch

from _batches import varied_batch
from rlpost import keys
from rlpost.engine import fused_logprob as fl
from rlpost.workers.actor import forward_response_logits, token_logp_entropy

pytestmark = pytest.mark.timeout(60)
TOL = {"atol": 1e-5, "rtol": 1e-5}


@pytest.mark.parametrize("with_entropy", [True, False])
def test_fused_logprob_equals_unfused_values_and_grads(with_entropy):
    g = torch.Generator().manual_seed(0)
    n, d, vocab = 13, 16, 37
    hidden = torch.randn(n, d, generator=g, requires_grad=True)
    weight = (torch.randn(vocab, d, generator=g) * 0.3).requires_grad_(True)
    labels = torch.randint(0, vocab, (n,), generator=g)
    w = torch.randn(n, 2, generator=g)
    out = fl.fused_logprob(hidden, weight, labels, fl.FusedHeadOptions(0.7, with_entropy, chunk=5))
    fused_grads = torch.autograd.grad((out * w).sum(), (hidden, weight))
    ref = token_logp_entropy(hidden @ weight.T, labels, 0.7, with_entropy=True, chunk=4)
    if not with_entropy:
        ref = torch.cat([ref[:, :1], torch.zeros_like(ref[:, 1:])], dim=1)
    ref_grads = torch.autograd.grad((ref * w).sum(), (hidden, weight))
    torch.testing.assert_close(out, ref, **TOL)
    for got, want in zip(fused_grads, ref_grads):
        torch.testing.assert_close(got, want, **TOL)
    with torch.no_grad():
        torch.testing.assert_close(fl.fused_logprob(hidden, weight, labels, fl.FusedHeadOptions(0.7, with_entropy, 64)),
                                   out, **TOL)


def test_entropy_checkpointing_and_small_chunks_keep_values_and_grads():
    g = torch.Generator().manual_seed(1)
    base = torch.randn(11, 23, generator=g) * 2
    labels = torch.randint(0, 23, (11,), generator=g)
    w = torch.randn(11, 2, generator=g)
    grads = []
    for chunk, checkpoint in ((4096, False), (3, True), (5, False)):
        logits = base.clone().requires_grad_(True)
        out = token_logp_entropy(logits, labels, 0.7, True, chunk=chunk, checkpoint=checkpoint)
        (out * w).sum().backward()
        grads.append((out.detach(), logits.grad))
    for out, grad in grads[1:]:
        torch.testing.assert_close(out, grads[0][0], **TOL)
        torch.testing.assert_close(grad, grads[0][1], **TOL)


@pytest.mark.parametrize("rmpad", [False, True])
def test_fused_head_in_model_equals_unfused(tiny_model_dir, rmpad):
    """Through the model (LM head swapped for the call): log-probs, entropy and every parameter's gradient."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    mb = varied_batch(model.config.vocab_size)
    real = mb[keys.RESPONSE_MASK].bool()

    def fn(logits, labels):
        return token_logp_entropy(logits, labels, 0.7, with_entropy=True)

    results = []
    for fused in (None, fl.FusedHeadOptions(0.7, True, chunk=7)):
        model.zero_grad()
        both = forward_response_logits(model, mb, rmpad, fn, fused=fused)
        (both[..., 0][real].sum() - 0.1 * both[..., 1][real].sum()).backward()
        results.append((both.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    (plain, plain_grads), (fused_out, fused_grads) = results
    assert "forward" not in vars(model.get_output_embeddings())  # the head's forward is restored
    torch.testing.assert_close(fused_out[real], plain[real], **TOL)
    for name, grad in plain_grads.items():
        torch.testing.assert_close(fused_grads[name], grad, atol=1e-5, rtol=1e-4, msg=name)


def test_compile_failure_falls_back_to_eager(monkeypatch, caplog):
    from torch._dynamo.exc import TorchDynamoException

    def broken_compile(fn, dynamic):
        def run(*args):
            raise TorchDynamoException("no compiler")
        return run

    def double(x):
        return x * 2

    monkeypatch.setattr(torch, "compile", broken_compile)
    with caplog.at_level(logging.WARNING):
        run = fl.compiled(double)
        assert run(torch.ones(2)).tolist() == [2.0, 2.0] and run(torch.ones(1)).tolist() == [2.0]
    assert sum("running it eagerly" in r.message for r in caplog.records) == 1


@pytest.mark.timeout(60)
def test_chunk_stats_entropy_is_stable_for_large_logits_and_leaves_them_unchanged():
    """One exp(z - max) temporary gives the softmax formula's values, also where exp(z) alone overflows."""
    g = torch.Generator().manual_seed(3)
    z = torch.randn(6, 1000, generator=g) * 4
    z[0] += 500.0  # exp(z) overflows float32 here
    z[1, :] = 0.0  # uniform: entropy log(V)
    labels = torch.randint(0, 1000, (6,), generator=g)
    before = z.clone()
    lse, logp, ent = fl.chunk_stats(z, labels, with_entropy=True)
    assert torch.equal(z, before)
    ref_logp = torch.log_softmax(z.double(), -1)
    torch.testing.assert_close(lse, torch.logsumexp(z.double(), -1).float())
    torch.testing.assert_close(logp, ref_logp.gather(-1, labels[:, None]).squeeze(-1).float())
    torch.testing.assert_close(ent, -(ref_logp.exp() * ref_logp).sum(-1).float())
    assert ent[1].item() == pytest.approx(torch.log(torch.tensor(1000.0)).item(), rel=1e-6)
    lse_only, logp_only, zeros = fl.chunk_stats(z, labels, with_entropy=False)
    torch.testing.assert_close(lse_only, lse)
    torch.testing.assert_close(logp_only, logp)
    assert not zeros.any()
