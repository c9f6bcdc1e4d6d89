"""Vision-language models (Qwen2-VL family) in the training engine: the per-row vision inputs of a micro-batch,
3-D rotary positions (mrope) from the model's own `get_rope_index`, and freezing the vision tower.

Rows carry their processor outputs as non-tensor `multi_modal_inputs` (ragged: each row its own patches); the
micro-batches carry `mm_row`, each row's index into that list, so dynamic batching and shuffling keep each row
with its pixels. The mrope positions are computed on the padded micro-batch; the packed path (`use_remove_padding`)
keeps those of the real tokens, (3, 1, N), so every packed sequence keeps its own 3-D positions (they need not
restart at 0 on each axis, hence the explicit sequence bounds of `rlpost.engine.packed_attention`). Under Ulysses
every rank runs the vision tower and the embedding on the whole packed row (the image features must meet their
placeholder tokens) and the language model on its slice (`language_model_slice`).
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Sequence

import torch

from rlpost import keys
from rlpost.engine.packed_attention import hf_model_of


def vision_tower(module: torch.nn.Module) -> torch.nn.Module | None:
    """The vision encoder (`model.visual` in transformers' VL models), None for a text model."""
    inner = getattr(hf_model_of(module), "model", None)
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
    inner = getattr(hf_model_of(module), "model", None)
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


def pack_positions(position_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(3, b, T) mrope positions of a padded micro-batch -> (3, 1, N) those of its real tokens, row after row
    (the order of `rlpost.utils.padding.unpad_input`)."""
    return position_ids[:, mask.bool()].unsqueeze(1)


def language_model(module: torch.nn.Module) -> torch.nn.Module:
    """The decoder stack that takes the merged text + image embeddings (`model.language_model`)."""
    lm = getattr(getattr(hf_model_of(module), "model", None), "language_model", None)
    if lm is None:
        raise ValueError(f"{type(module).__name__} has no model.language_model: rows with images need a "
                         "Qwen2-VL-family model")
    return lm


@contextlib.contextmanager
def language_model_slice(module: torch.nn.Module, start: int, length: int) -> Iterator[None]:
    """While active, the language model of `module` sees tokens start .. start+length-1 of its input only.

    The model embeds the whole row and scatters the image features into it first (every placeholder meets its
    feature); this forward pre-hook then cuts `inputs_embeds` (1, N, H) and `position_ids` (3, 1, N) to this
    Ulysses rank's slice."""

    def cut(_mod: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        kwargs["inputs_embeds"] = kwargs["inputs_embeds"][:, start:start + length]
        kwargs["position_ids"] = kwargs["position_ids"][..., start:start + length]
        return args, kwargs

    handle = language_model(module).register_forward_pre_hook(cut, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()


def mm_rows(data: Any) -> list[dict] | None:
    """The batch's per-row `multi_modal_inputs` (non-tensor), or None when it has none."""
    non_tensor = getattr(data, "non_tensor_batch", None) or {}
    rows = non_tensor.get(keys.MULTI_MODAL_INPUTS)
    if rows is None or not any(isinstance(r, dict) and r for r in rows):
        return None
    return list(rows)
