"""Vision-language models (Qwen2-VL family) in the training engine: the per-row vision inputs of a micro-batch,
3-D rotary positions (mrope) from the model's own `get_rope_index`, and freezing the vision tower.

Rows carry their processor outputs as non-tensor `multi_modal_inputs` (ragged: each row its own patches); the
micro-batches carry `mm_row`, each row's index into that list, so dynamic batching and shuffling keep each row
with its pixels. Only the padded path is built: packed rows (`use_remove_padding`) and Ulysses would need the
mrope positions packed too, and are refused at start-up for these models.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from rlpost import keys


def vision_tower(module: torch.nn.Module) -> torch.nn.Module | None:
    """The vision encoder (`model.visual` in transformers' VL models), None for a text model."""
    inner = getattr(module, "model", None)
    return getattr(inner, "visual", None)


def freeze_vision_tower(module: torch.nn.Module) -> int:
    """Stop gradients into the vision tower (`actor.freeze_vision_tower`); returns the frozen parameter count.

    Raises:
        ValueError: the model has no vision tower.
    """
    tower = vision_tower(module)
    if tower is None:
        raise ValueError(f"actor_rollout_ref.actor.freeze_vision_tower=true: {type(module).__name__} has no vision "
                         "tower (a text-only model); set it to false")
    count = 0
    for p in tower.parameters():
        p.requires_grad_(False)
        count += p.numel()
    return count


def _rope_model(module: torch.nn.Module) -> Any:
    inner = getattr(module, "model", None)
    if inner is None or not hasattr(inner, "get_rope_index"):
        raise ValueError(f"{type(module).__name__} has no get_rope_index: rows with images need a Qwen2-VL-family "
                         "model")
    return inner


def vision_inputs(module: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, mm_row: torch.Tensor,
                  rows: Sequence[dict]) -> dict[str, torch.Tensor]:
    """Model keyword arguments of the vision part of one micro-batch.

    Args:
        ids, mask: (b, T) input ids and attention mask (left-padded prompt + right-padded response).
        mm_row: (b,) index of each row in `rows`.
        rows: per-row `multi_modal_inputs` of the whole batch ({} for a row without images).

    Returns:
        {} when no row of the micro-batch has an image; else `pixel_values` (n_patches, C*T*P*P) and
        `image_grid_thw` (n_images, 3) of the rows in order, and `position_ids` (3, b, T): mrope positions
        of every token from `get_rope_index` (0 on padding).
    """
    picked = [rows[int(i)] for i in mm_row.tolist()]
    with_images = [r for r in picked if r and r.get("pixel_values") is not None]
    if not with_images:
        return {}
    inner = _rope_model(module)
    grid = torch.cat([r["image_grid_thw"] for r in with_images]).to(ids.device)
    types = (ids == inner.config.image_token_id).long()  # 1 on image tokens, 0 on text
    position_ids, _ = inner.get_rope_index(ids, mm_token_type_ids=types, image_grid_thw=grid, attention_mask=mask)
    return {"pixel_values": torch.cat([r["pixel_values"] for r in with_images]).to(ids.device),
            "image_grid_thw": grid, "position_ids": position_ids}


def mm_rows(data: Any) -> list[dict] | None:
    """The batch's per-row `multi_modal_inputs` (non-tensor), or None when it has none."""
    non_tensor = getattr(data, "non_tensor_batch", None) or {}
    rows = non_tensor.get(keys.MULTI_MODAL_INPUTS)
    if rows is None or not any(isinstance(r, dict) and r for r in rows):
        return None
    return list(rows)
