"""A padded batch with varied prompt and response lengths for the packed/fused log-prob tests."""

from __future__ import annotations

from typing import Any

import torch

from rlpost import keys


def varied_batch(vocab: int, p: int = 7, r: int = 6) -> dict[str, torch.Tensor]:
    """5 rows: left-padded prompts (up to p) and right-padded responses (up to r) of varied lengths (at the
    defaults one response of 1 token)."""
    g = torch.Generator().manual_seed(0)
    p_len = (torch.tensor([1.0, 0.3, 0.7, 0.15, 0.6]) * p).long().clamp(min=1)
    r_len = (torch.tensor([1.0, 0.5, 0.17, 1.0, 0.67]) * r).long().clamp(min=1)
    p_mask = (torch.arange(p)[None] >= (p - p_len)[:, None]).long()
    r_mask = (torch.arange(r)[None] < r_len[:, None]).long()
    prompts = torch.randint(3, vocab, (5, p), generator=g) * p_mask
    responses = torch.randint(3, vocab, (5, r), generator=g) * r_mask
    attn = torch.cat([p_mask, r_mask], dim=1)
    return {keys.RESPONSES: responses, keys.RESPONSE_MASK: r_mask, keys.INPUT_IDS: torch.cat([prompts, responses], 1),
            keys.ATTENTION_MASK: attn, keys.POSITION_IDS: (attn.cumsum(-1) - 1).clamp(min=0)}


def own_policy_actor(vocab: int) -> tuple[Any, dict[str, torch.Tensor], torch.Tensor]:
    """A `DataParallelPPOActor` of the SMALL config over a random tiny Qwen2 (SGD at lr 0), `varied_batch(vocab)`
    and the policy's own log-probs of its responses (B, R)."""
    from _compose import SMALL, typed_config_of
    from rlpost.utils.tiny_families import family_model
    from rlpost.workers.actor import DataParallelPPOActor

    cfg = typed_config_of(*SMALL).actor_rollout_ref.actor
    model = family_model("qwen2", vocab)
    actor = DataParallelPPOActor(cfg, model, torch.optim.SGD(model.parameters(), lr=0.0), use_remove_padding=False)
    batch = varied_batch(vocab)
    with torch.no_grad():
        own = actor._forward_micro_batch(batch, 1.0, calculate_entropy=False)[1]
    return actor, batch, own
