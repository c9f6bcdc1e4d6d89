"""The router load-balancing (aux) loss of MoE models whose config asks for it (`output_router_logits: true`,
weighted by the config's `router_aux_loss_coef`), added to the actor's loss and logged as `actor/moe_aux_loss`.

Off unless the model's config turns it on (the released Qwen3-MoE / Mixtral configs keep `output_router_logits`
false, and verl leaves the aux loss out of RL). transformers computes it in the model's forward over the real
tokens (the padding mask on padded batches; a packed row has no padding), so both paths give the same value.
"""

from __future__ import annotations

from typing import Any

import torch


class RouterAuxLoss:
    """Collects the `aux_loss` the model returns from each forward that builds a graph (the update's)."""

    def __init__(self, hf_model: Any) -> None:
        self.coef = float(getattr(hf_model.config.get_text_config(), "router_aux_loss_coef", 0.0) or 0.0)
        self._values: list[torch.Tensor] = []
        hf_model.register_forward_hook(self._hook)

    def _hook(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        aux = getattr(output, "aux_loss", None)
        if torch.is_grad_enabled() and isinstance(aux, torch.Tensor):
            self._values.append(aux)

    def take(self) -> torch.Tensor | None:
        """The aux loss of the forwards since the last call (their sum), or None."""
        values, self._values = self._values, []
        return torch.stack([v.float() for v in values]).sum() if values else None


def router_aux_loss(model: torch.nn.Module) -> RouterAuxLoss | None:
    """A `RouterAuxLoss` on `model` when its config sets `output_router_logits` with a non-zero coefficient."""
    from rlpost.engine.packed_attention import hf_model_of

    hf_model = hf_model_of(model)
    config = hf_model.config.get_text_config()
    if not getattr(config, "output_router_logits", False):
        return None
    collector = RouterAuxLoss(hf_model)
    return collector if collector.coef else None
