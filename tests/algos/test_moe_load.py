"""MoE load metrics (`rlpost.algos.moe_load`): counts of hand-made routing, deviation figures derived by hand, and
the counts of a tiny Qwen3-MoE's recorded routing against its routers' own top-k computed apart."""

from __future__ import annotations

import pytest
import torch

from rlpost.algos.moe_load import due, load_balance_metrics, row_expert_counts

pytestmark = pytest.mark.timeout(120)


def test_counts_of_hand_made_routing_skip_masked_positions():
    # 1 row, 3 positions, 2 layers, top-2 of 4 experts; position 0 is masked out
    routed = torch.tensor([[[[0, 1], [2, 3]],
                            [[0, 2], [2, 2]],
                            [[0, 3], [1, 2]]]])
    mask = torch.tensor([[False, True, True]])
    counts = row_expert_counts(routed, mask, 4)
    assert counts.tolist() == [[[2, 0, 1, 1],    # layer 0: experts 0, 2 then 0, 3
                                [0, 1, 3, 0]]]   # layer 1: experts 2, 2 then 1, 2
    assert int(counts.sum()) == 2 * 2 * 2       # tokens x layers x top-k


def test_deviation_figures_by_hand():
    counts = torch.tensor([[2, 0, 1, 1],     # shares .5 0 .25 .25 -> d = 1, -1, 0, 0
                           [1, 1, 1, 1]])    # uniform -> d = 0 everywhere
    m = load_balance_metrics(counts)
    assert m["actor/moe/max_vio/layer_0"] == pytest.approx(1.0)
    assert m["actor/moe/min_vio/layer_0"] == pytest.approx(-1.0)
    assert m["actor/moe/avg_vio/layer_0"] == pytest.approx(0.5)     # (1 + 1 + 0 + 0) / 4
    assert m["actor/moe/max_vio/layer_1"] == 0 and m["actor/moe/avg_vio/layer_1"] == 0
    assert m["actor/moe/max_vio/max"] == pytest.approx(1.0) and m["actor/moe/max_vio/avg"] == pytest.approx(0.5)
    assert m["actor/moe/min_vio/max"] == pytest.approx(0.0) and m["actor/moe/min_vio/avg"] == pytest.approx(-0.5)
    assert load_balance_metrics(torch.zeros(2, 4, dtype=torch.int64)) == {}


def test_bad_ids_and_shapes_are_refused():
    with pytest.raises(ValueError, match="outside"):
        row_expert_counts(torch.tensor([[[[4]]]]), torch.tensor([[True]]), 4)
    with pytest.raises(ValueError, match="do not fit"):
        row_expert_counts(torch.zeros(1, 2, 1, 1, dtype=torch.long), torch.ones(1, 3, dtype=torch.bool), 4)


def test_due_every_interval_steps():
    assert [s for s in range(1, 8) if due(3, s)] == [3, 6]
    assert not any(due(0, s) for s in range(1, 8))


def test_counts_of_a_tiny_qwen3_moe_match_its_routers_topk():
    """The recorder's routing of one forward, counted, equals the top-k of each router's own logits over
    the same tokens (the logits taken by hooks on the routers, their top-k computed here)."""
    from rlpost.utils.router_replay import replayable_routers, to_grid, use_router_replay
    from rlpost.utils.tiny_families import family_model

    torch.manual_seed(0)
    model = family_model("qwen3_moe", 96).eval()
    routers = replayable_routers(model)
    seen: list[torch.Tensor] = []
    hooks = [r.register_forward_hook(lambda mod, inp, out: seen.append(out[0].detach())) for r in routers]  # logits
    state = use_router_replay(model)
    ids = torch.randint(0, 96, (1, 11))
    state.mode = "record"
    with torch.no_grad():
        model(input_ids=ids, position_ids=torch.arange(11)[None])
    state.mode = None
    for h in hooks:
        h.remove()
    mask = torch.ones(1, 11, dtype=torch.bool)
    routed = to_grid(state.recorded, mask, packed=False)
    experts = model.config.num_experts
    counts = row_expert_counts(routed, mask, experts)[0]
    assert counts.shape == (len(routers), experts)
    k = model.config.num_experts_per_tok
    for layer, logits in enumerate(seen):
        topk = torch.topk(logits.float(), k, dim=-1).indices
        assert counts[layer].tolist() == torch.bincount(topk.reshape(-1), minlength=experts).tolist()
