"""Vision-language models (Qwen2-VL family) in the training engine: the per-row vision inputs of a micro-batch,
3-D rotary positions (mrope) from the model's own `get_rope_index`, and freezing the vision tower.

Rows carry their processor outputs as non-tensor `multi_modal_inputs` (ragged: each row its own patches); the
micro-batches carry `mm_row`, each row's index into that list, so dynamic batching and shuffling keep each row
with its pixels. The mrope positions are computed on the padded micro-batch; the packed path (`use_remove_padding`)
keeps those of the real tokens, (3, 1, N), so every packed sequence keeps its own 3-D positions (they need not
restart at 0 on each axis, hence the explicit sequence bounds of `rlpost.engine.packed_attention`). Under Ulysses
every rank runs the vision tower and the embedding on the whole packed row (the image features must meet their
placeholder tokens) and the language model on its slice (`language_model_slice`).

Which `<|image_pad|>` tokens are images: the policy may sample any id, so a response can hold `<|image_pad|>`
(and `<|vision_start|>`) tokens with no image behind them. A row's real placeholders are found by their
structure (`image_placeholders`): for the row's images in order, the next run of exactly that image's token count
(t*h*w / merge**2) of `<|image_pad|>` that directly follows a `<|vision_start|>`. This holds for images anywhere
in the row (a tool's image in a later turn too); only a sampled `<|vision_start|>` followed by exactly an image's
count of `<|image_pad|>` before that image's own block would be taken for it. Every other `<|image_pad|>` is text:
it gets 1-D positions in `get_rope_index` and keeps its token embedding (`real_placeholders` gives the model's
`get_placeholder_mask` this mask for the call, in the layout of the ids the model is given).
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


def image_placeholders(ids: torch.Tensor, mask: torch.Tensor, counts: Sequence[Sequence[int]], image_id: int,
                       start_id: int) -> torch.Tensor:
    """(b, T) bool: the real image placeholder tokens of each row (the rule in the module docstring).

    Args:
        ids, mask: (b, T) input ids and attention mask.
        counts: per row, the token count of each of its images, in order.

    Raises:
        ValueError: a row has fewer `<|vision_start|>` + placeholder blocks than images.
    """
    out = torch.zeros(ids.shape, dtype=torch.bool)
    for row, (seq, real, wanted) in enumerate(zip(ids.tolist(), mask.tolist(), counts)):
        at = 0
        for k, n in enumerate(wanted):
            while at < len(seq):
                if real[at] and seq[at] == start_id and seq[at + 1:at + 1 + n] == [image_id] * n and \
                        (at + 1 + n == len(seq) or seq[at + 1 + n] != image_id):
                    break
                at += 1
            if at >= len(seq):
                raise ValueError(f"row {row} of the micro-batch: image {k} ({n} tokens) has no <|vision_start|> "
                                 f"followed by {n} <|image_pad|> tokens (the processor's placeholders); {k} of "
                                 f"its {len(wanted)} images were found")
            out[row, at + 1:at + 1 + n] = True
            at += 1 + n
    return out.to(ids.device)


def vision_inputs(module: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, mm_row: torch.Tensor,
                  rows: Sequence[dict]) -> dict[str, torch.Tensor]:
    """Model keyword arguments of the vision part of one micro-batch.

    Args:
        ids, mask: (b, T) input ids and attention mask (left-padded prompt + right-padded response).
        mm_row: (b,) index of each row in `rows`.
        rows: per-row `multi_modal_inputs` of the whole batch ({} for a row without images).

    Returns:
        {} when no row of the micro-batch has an image; else `pixel_values` (n_patches, C*T*P*P) and
        `image_grid_thw` (n_images, 3) of the rows in order, `position_ids` (3, b, T): mrope positions of every
        token from `get_rope_index` (0 on padding), and `image_mask` (b, T): the real placeholders
        (`image_placeholders`), not a model argument: run the model under `real_placeholders`.
    """
    picked = [rows[int(i)] for i in mm_row.tolist()]
    with_images = [r for r in picked if r and r.get("pixel_values") is not None]
    if not with_images:
        return {}
    inner = _rope_model(module)
    merge = inner.config.vision_config.spatial_merge_size ** 2
    counts = [(r["image_grid_thw"].prod(-1) // merge).tolist() if r and r.get("pixel_values") is not None else []
              for r in picked]
    image_mask = image_placeholders(ids, mask, counts, inner.config.image_token_id,
                                    inner.config.vision_start_token_id)
    grid = torch.cat([r["image_grid_thw"] for r in with_images]).to(ids.device)
    position_ids, _ = inner.get_rope_index(ids, mm_token_type_ids=image_mask.long(), image_grid_thw=grid,
                                           attention_mask=mask)
    return {"pixel_values": torch.cat([r["pixel_values"] for r in with_images]).to(ids.device),
            "image_grid_thw": grid, keys.POSITION_IDS: position_ids, keys.IMAGE_MASK: image_mask}


def model_kwargs(vision: dict | None) -> dict[str, torch.Tensor]:
    """The model arguments of `vision_inputs`' output (all but `image_mask`)."""
    return {k: v for k, v in (vision or {}).items() if k != keys.IMAGE_MASK}


@contextlib.contextmanager
def real_placeholders(module: torch.nn.Module, image_mask: torch.Tensor | None) -> Iterator[None]:
    """While active, the model scatters the image features into the positions `image_mask` only.

    `image_mask` has the layout of the `input_ids` the model is called with ((b, T) padded, (1, N) packed);
    None: nothing changes. Overrides the inner model's `get_placeholder_mask` on the instance (Qwen2-VL and
    Qwen2.5-VL call it from their forward); videos keep the model's own rule."""
    if image_mask is None:
        yield
        return
    inner = _rope_model(module)
    own = inner.get_placeholder_mask

    def placeholder_mask(input_ids: torch.Tensor, inputs_embeds: torch.Tensor, image_features: Any = None,
                         video_features: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
        _, video = own(input_ids, inputs_embeds=inputs_embeds, video_features=video_features)
        if input_ids is None or tuple(input_ids.shape) != tuple(image_mask.shape):
            raise ValueError(f"real_placeholders: the image mask {tuple(image_mask.shape)} does not match the "
                             f"model's input ids {None if input_ids is None else tuple(input_ids.shape)}")
        n = int(image_mask.sum())
        if image_features is not None and n * inputs_embeds.shape[-1] != image_features.numel():
            raise ValueError(f"image features and image placeholders do not match: {n} placeholders, "
                             f"{image_features.shape[0]} features")
        return image_mask.unsqueeze(-1).to(inputs_embeds.device), video

    inner.get_placeholder_mask = placeholder_mask
    try:
        yield
    finally:
        del inner.get_placeholder_mask


def pack_positions(position_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(3, b, T) mrope positions of a padded micro-batch -> (3, 1, N) those of its real tokens, row after row
    (the order of `rlpost.utils.padding.unpad_input`); a (b, T) tensor (the image mask) -> (1, N)."""
    if position_ids.dim() == 2:
        return position_ids[mask.bool()].unsqueeze(0)
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
