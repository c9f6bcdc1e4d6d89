"""MoE router replay (R2) on a tiny Qwen3-MoE: the recorded experts are the ones the replayed forward uses, the
same weights give the same log-probs, changed routers still get gradients through the mixing weights, and the
record's layout is the same for the padded and the packed forward."""

from __future__ import annotations

import pytest
import torch

from _batches import varied_batch
from rlpost import keys
from rlpost.utils.router_replay import from_grid, replay_metrics, replayable_routers, to_grid, use_router_replay
from rlpost.utils.tiny_families import family_model

pytestmark = pytest.mark.timeout(120)
VOCAB = 96


def _logp(model, batch, packed: bool) -> torch.Tensor:
    from rlpost.workers.actor import forward_response_logits, token_logp_entropy

    return forward_response_logits(model, batch, packed, lambda lg, lb: token_logp_entropy(lg, lb)[..., 0])


def _model(packed: bool):
    from rlpost.engine.packed_attention import use_packed_attention

    model = family_model("qwen3_moe", VOCAB)
    if packed:
        use_packed_attention(model)
    return model, use_router_replay(model)


def _expert_choices(model) -> tuple[list, list]:
    """Hooks recording the expert indices each MoE block's experts are called with."""
    seen, handles = [], []
    for block in model.modules():
        if type(block).__name__ == "Qwen3MoeExperts":
            handles.append(block.register_forward_pre_hook(lambda m, args: seen.append(args[1].clone())))
    return seen, handles


@pytest.mark.parametrize("packed", [False, True])
def test_replay_routes_to_the_recorded_experts_and_keeps_the_router_learning(packed):
    batch = varied_batch(VOCAB)
    mask = batch[keys.ATTENTION_MASK]
    model, state = _model(packed)
    assert len(replayable_routers(model)) == 2  # one per decoder layer (decoder_sparse_step=1)
    state.mode = "record"
    with torch.no_grad():
        before = _logp(model, batch, packed)
    routed = to_grid(state.recorded, mask, packed)
    assert routed.shape == (*mask.shape, 2, 2)  # (B, T, layers, top-k)

    state.mode, state.indices = "replay", from_grid(routed, mask, packed)
    with torch.no_grad():
        same = _logp(model, batch, packed)
    torch.testing.assert_close(same, before, atol=0, rtol=0)
    assert replay_metrics(state, mask, packed) == {"actor/router_replay/changed_fraction": 0.0}

    with torch.no_grad():  # move the routers far enough that their own top-2 changes for many tokens
        for router in replayable_routers(model):
            router.weight.add_(torch.randn_like(router.weight) * 5)
    seen, handles = _expert_choices(model)
    logp = _logp(model, batch, packed)
    for h in handles:
        h.remove()
    assert replay_metrics(state, mask, packed)["actor/router_replay/changed_fraction"] > 0.1
    for used, recorded in zip(seen, state.indices):
        assert torch.equal(used, recorded)  # the experts called are the recorded ones
    (logp * batch[keys.RESPONSE_MASK]).sum().backward()
    for router in replayable_routers(model):
        assert router.weight.grad is not None and router.weight.grad.abs().sum() > 0

    state.mode = None  # off: the model routes by its own (moved) routers again
    seen, handles = _expert_choices(model)
    with torch.no_grad():
        _logp(model, batch, packed)
    for h in handles:
        h.remove()
    assert any(not torch.equal(u, r) for u, r in zip(seen, state.indices))


def test_padded_and_packed_records_agree_on_real_tokens():
    batch = varied_batch(VOCAB)
    mask = batch[keys.ATTENTION_MASK].bool()
    grids = []
    for packed in (False, True):
        model, state = _model(packed)
        state.mode = "record"
        with torch.no_grad():
            _logp(model, batch, packed)
        grids.append(to_grid(state.recorded, batch[keys.ATTENTION_MASK], packed))
    assert torch.equal(grids[0][mask].sort(-1).values, grids[1][mask].sort(-1).values)
    assert int(grids[1][~mask].abs().sum()) == 0  # padding holds 0 in the packed record


def test_a_dense_model_has_nothing_to_replay():
    with pytest.raises(ValueError, match="router replay needs an MoE model"):
        use_router_replay(family_model("qwen3", VOCAB))
