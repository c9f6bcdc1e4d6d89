"""MoE router replay (verl's `actor.router_replay.mode=R2`): the experts the old-log-prob pass routed each token to
are recorded and the policy update routes every token to the same experts.

Why: the importance ratio pi_theta / pi_old compares two forwards of the same tokens; in an MoE model a small weight
change can flip a token's top-k experts, and the flip (not the update) then moves the ratio, which clipping cannot
tell apart from a real policy change. Replaying the recorded experts makes the update's forward differ from the
old one only through the weights; the router still learns, through the mixing weights of the experts it had chosen.

Routers: transformers' softmax top-k routers, which return (logits, scores, expert indices): Qwen2-MoE, Qwen3-MoE,
Qwen3-Next, Qwen3.5-MoE, OLMoE, Mixtral (`REPLAYABLE_ROUTERS`). Other routing (DeepSeek's / GLM's sigmoid groups
with a bias) is refused at start-up.

Layout: `routed_experts` (B, T, L, K) int, per row and position of the padded batch, L = MoE layers in model order,
K = experts per token; positions that are padding hold 0. A forward's routers see their tokens flattened in the
order the actor feeds them (the padded grid row by row, or the packed row of real tokens), which is how the
indices are cut for them.
"""

from __future__ import annotations

import types
from dataclasses import dataclass, field
from typing import Any

import torch

REPLAYABLE_ROUTERS = frozenset({"Qwen2MoeTopKRouter", "Qwen3MoeTopKRouter", "Qwen3NextTopKRouter",
                                "Qwen3_5MoeTopKRouter", "OlmoeTopKRouter", "MixtralTopKRouter"})
# (a multi-modal model's text config names its own type: Qwen3.5-MoE's is qwen3_5_moe_text)
REPLAYABLE_MODEL_TYPES = frozenset({"qwen2_moe", "qwen3_moe", "qwen3_next", "qwen3_5_moe", "qwen3_5_moe_text", "olmoe",
                                    "mixtral"})
_STATE = "_rlpost_router_replay"


@dataclass
class ReplayState:
    """What the routers do in the current forward: record their choices, replay given ones, or nothing.

    Attributes:
        mode: "record", "replay" or None (route as the model does).
        recorded: per router (model order), the (n, K) indices of the last recorded forward.
        indices: per router, the (n, K) indices to replay, in the forward's token order.
        changed: per router, the count of tokens whose own top-k differed from the replayed one (last forward).
    """

    mode: str | None = None
    recorded: list[torch.Tensor] = field(default_factory=list)
    indices: list[torch.Tensor] = field(default_factory=list)
    changed: list[int] = field(default_factory=list)


def replayable_routers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The replayable routers of `model`, in model order (empty for a dense model)."""
    return [m for m in model.modules() if type(m).__name__ in REPLAYABLE_ROUTERS]


def _routed(router: torch.nn.Module, state: ReplayState, slot: int, hidden: torch.Tensor
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    logits, scores, indices = type(router).forward(router, hidden)
    if state.mode == "record":
        state.recorded[slot] = indices.detach()
    elif state.mode == "replay":
        chosen = state.indices[slot].to(indices.device)
        if chosen.shape != indices.shape:
            raise ValueError(f"router replay: {tuple(chosen.shape)} recorded indices for a forward of "
                             f"{tuple(indices.shape)} (the replayed batch is not the recorded one)")
        state.changed[slot] = int((indices.sort(-1).values != chosen.sort(-1).values).any(-1).sum())
        probs = torch.softmax(logits.float(), dim=-1).gather(-1, chosen)
        if getattr(router, "norm_topk_prob", True):  # Mixtral always normalises; the others say so
            probs = probs / probs.sum(dim=-1, keepdim=True)
        scores, indices = probs.to(scores.dtype), chosen
    return logits, scores, indices


def use_router_replay(model: torch.nn.Module) -> ReplayState:
    """Patch `model`'s routers to follow a shared `ReplayState` (idempotent); returns it.

    Raises:
        ValueError: the model has no replayable router.
    """
    existing = getattr(model, _STATE, None)
    if existing is not None:
        return existing
    routers = replayable_routers(model)
    if not routers:
        raise ValueError("router replay needs an MoE model with softmax top-k routers "
                         f"({', '.join(sorted(REPLAYABLE_MODEL_TYPES))}); this model has none")
    state = ReplayState(recorded=[torch.empty(0)] * len(routers), indices=[torch.empty(0)] * len(routers),
                        changed=[0] * len(routers))
    for slot, router in enumerate(routers):
        router.forward = types.MethodType(lambda self, hidden, _s=slot: _routed(self, state, _s, hidden), router)
    setattr(model, _STATE, state)
    return state


def to_grid(per_router: list[torch.Tensor], mask: torch.Tensor, packed: bool) -> torch.Tensor:
    """(B, T, L, K) `routed_experts` of one forward's recorded (n, K) indices per router.

    Args:
        mask: (B, T) attention mask of the forward's rows. packed: the forward ran the packed row of real tokens
            (n = mask.sum()); else the padded grid (n = B * T).
    """
    b, t = mask.shape
    stacked = torch.stack([r.to(torch.int32) for r in per_router], dim=1)  # (n, L, K)
    if not packed:
        return stacked.reshape(b, t, *stacked.shape[1:])
    grid = stacked.new_zeros((b * t, *stacked.shape[1:]))
    grid[mask.reshape(-1).bool()] = stacked
    return grid.reshape(b, t, *stacked.shape[1:])


def from_grid(routed: torch.Tensor, mask: torch.Tensor, packed: bool) -> list[torch.Tensor]:
    """Per router, the (n, K) long indices a forward of these rows replays (the inverse of `to_grid`)."""
    flat = routed.reshape(-1, *routed.shape[2:])
    if packed:
        flat = flat[mask.reshape(-1).bool()]
    return [flat[:, layer].long() for layer in range(routed.shape[2])]


def replay_metrics(state: ReplayState, mask: torch.Tensor, packed: bool) -> dict[str, Any]:
    """Fraction of (token, router) pairs whose own routing in the last replayed forward differed from the record."""
    tokens = int(mask.sum()) if packed else mask.numel()
    total = tokens * max(len(state.changed), 1)
    return {"actor/router_replay/changed_fraction": sum(state.changed) / max(total, 1)}
