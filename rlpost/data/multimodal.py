"""verl's multi-modal prompt rows: `<image>` placeholders in the messages, an images column, the model's processor.

A row's images column (`data.image_key`) holds a list of entries, each `{"bytes": <encoded image>}`,
`{"image": <path or bytes>}` (also `{"path": ...}`), a path, raw bytes or a PIL image. Each `<image>` in the
text of the prompt's messages marks where one image goes, in order. The processor (`AutoProcessor` of the model)
renders the chat template and expands each image into its vision tokens; the engines get the prompt with ONE
`<|image_pad|>` per image (they expand it themselves) and the images.

Per row, `encode` returns the expanded prompt ids (what the actor sees), the unexpanded ids (what the engine
sees) and `multi_modal_inputs`: {pixel_values (n_patches, C*T*P*P), image_grid_thw (n_images, 3)}.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np

PLACEHOLDER = "<image>"
MM_INPUT_KEYS = ("pixel_values", "image_grid_thw")


class MultiModalRowError(ValueError):
    """A multi-modal row that cannot be used; the message names the file, the row and the fix."""


def _as_list(value: Any) -> list:
    if value is None:
        return []
    if isinstance(value, np.ndarray):
        return list(value)
    return list(value) if isinstance(value, (list, tuple)) else [value]


def load_image(entry: Any, where: str) -> Any:
    """One images-column entry as an RGB PIL image.

    Raises:
        MultiModalRowError: a missing file or bytes that are not an image, naming `where` (file and row).
    """
    from PIL import Image

    if isinstance(entry, Image.Image):
        return entry.convert("RGB")
    source = entry
    if isinstance(entry, dict):
        source = next((entry[k] for k in ("bytes", "image", "path") if entry.get(k) is not None), None)
        if source is None:
            raise MultiModalRowError(f"{where}: image entry {entry!r:.80} has no 'bytes', 'image' or 'path'; "
                                     "give {'bytes': <png/jpeg bytes>} or {'image': '/path/to/file.png'}")
        if isinstance(source, Image.Image):
            return source.convert("RGB")
    if isinstance(source, (str, Path)):
        path = Path(str(source).removeprefix("file://"))
        if not path.is_file():
            raise MultiModalRowError(f"{where}: image file not found: {path}; fix the path in the images column "
                                     "(data.image_key) or store the image as {'bytes': ...}")
        source = path.read_bytes()
    if not isinstance(source, (bytes, bytearray)):
        raise MultiModalRowError(f"{where}: image entry of type {type(source).__name__} is not bytes, a path or "
                                 "a PIL image")
    try:
        with Image.open(io.BytesIO(source)) as img:
            return img.convert("RGB")
    except Exception as exc:  # PIL raises several types for undecodable data
        raise MultiModalRowError(f"{where}: image bytes cannot be decoded ({type(exc).__name__}: {exc}); "
                                 "store PNG or JPEG bytes") from None


def with_image_parts(messages: list[dict]) -> list[dict]:
    """Messages whose text has `<image>` placeholders, with each such content split into parts
    [{"type": "image"}, {"type": "text", "text": ...}] in order (the processor's chat-template form)."""
    out = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, str) and PLACEHOLDER in content:
            parts: list[dict] = []
            for i, text in enumerate(content.split(PLACEHOLDER)):
                if i:
                    parts.append({"type": "image"})
                if text:
                    parts.append({"type": "text", "text": text})
            message = {**message, "content": parts}
        out.append(message)
    return out


def count_placeholders(messages: list[dict]) -> int:
    """Number of `<image>` placeholders in the messages' text."""
    return sum(str(m.get("content") or "").count(PLACEHOLDER) for m in messages if isinstance(m.get("content"), str))


class MultiModalEncoder:
    """Applies the model's processor to (messages, images) rows.

    Args:
        processor: the model's `AutoProcessor` (a Qwen2-VL-family processor).
        mm_processor_kwargs: `data.mm_processor_kwargs`, passed to every processor call (e.g. min_pixels).
        chat_template_kwargs: `data.apply_chat_template_kwargs`.
    """

    def __init__(self, processor: Any, mm_processor_kwargs: dict, chat_template_kwargs: dict) -> None:
        self.processor = processor
        self.mm_kwargs = dict(mm_processor_kwargs)
        self.chat_kwargs = dict(chat_template_kwargs)
        self.merge = int(getattr(processor.image_processor, "merge_size", 2))

    def template(self, messages: list[dict]) -> str:
        """The prompt text: the processor's chat template over the messages with image parts."""
        return self.processor.apply_chat_template(with_image_parts(messages), add_generation_prompt=True,
                                                  tokenize=False, **self.chat_kwargs)

    def images(self, column: Any, messages: list[dict], where: str) -> list[Any]:
        """The row's images, checked against its placeholders.

        Raises:
            MultiModalRowError: placeholder count != image count, or an image cannot be read.
        """
        entries = _as_list(column)
        wanted = count_placeholders(messages)
        if wanted != len(entries):
            raise MultiModalRowError(
                f"{where}: the prompt has {wanted} '{PLACEHOLDER}' placeholder(s) but the images column has "
                f"{len(entries)} image(s); put one '{PLACEHOLDER}' in the message text for each image")
        return [load_image(e, where) for e in entries]

    def vision_inputs(self, images: list[Any]) -> dict[str, Any]:
        """{pixel_values, image_grid_thw} of `images` (torch tensors), {} without images."""
        if not images:
            return {}
        out = self.processor.image_processor(images=images, return_tensors="pt", **self.mm_kwargs)
        return {k: out[k] for k in MM_INPUT_KEYS}

    def encode(self, text: str, images: list[Any]) -> tuple[list[int], list[int], dict[str, Any]]:
        """(prompt ids with each image expanded to its vision tokens, prompt ids with one image token per
        image, multi_modal_inputs) of one templated prompt."""
        tok = self.processor.tokenizer
        raw = tok(text, add_special_tokens=False)["input_ids"]
        mm = self.vision_inputs(images)
        if not mm:
            return list(raw), list(raw), {}
        image_id = tok.convert_tokens_to_ids(self.processor.image_token)
        counts = iter((mm["image_grid_thw"].prod(-1) // self.merge ** 2).tolist())
        expanded: list[int] = []
        for t in raw:
            expanded.extend([image_id] * next(counts) if t == image_id else [t])
        return expanded, list(raw), mm

    def prompt_length(self, text: str, images: list[Any]) -> int:
        """Token count of the expanded prompt (text plus every image's vision tokens)."""
        return len(self.encode(text, images)[0])
