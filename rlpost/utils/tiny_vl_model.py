"""Build a tiny Qwen2-VL- or Qwen2.5-VL-architecture model and its processor, offline, in seconds.

The language model is the tiny Qwen2 of `rlpost.utils.tiny_model` (head_dim 64 for vLLM's CPU attention) with
3-D rotary positions (mrope); the vision tower is two blocks of 32 channels over 14x14 patches (Qwen2.5-VL's:
window attention in the first block, full attention in the second, a SwiGLU MLP, RMSNorm). The folder holds
the model, the tokenizer (with the vision tokens) and the family's processor whose image processor keeps
images small (`min_pixels` / `max_pixels`), so `AutoProcessor.from_pretrained` and vLLM both load it.

    path = build_tiny_vl_model("/tmp/tiny_vl")   # then actor_rollout_ref.model.path=/tmp/tiny_vl
    path = build_tiny_vl_model("/tmp/tiny_vl25", arch="qwen2_5_vl")
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

from rlpost.utils.tiny_model import build_tokenizer

VISION_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]

# ChatML as in `tiny_model.CHAT_TEMPLATE`, with Qwen2-VL's content parts: {"type": "image"} renders the vision
# block that the processor expands to one <|image_pad|> per merged patch; {"type": "text"} its text.
VL_CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string %}{{- message['content'] }}"
    "{%- else %}{%- for part in message['content'] %}"
    "{%- if part['type'] == 'image' or 'image' in part %}{{- '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{%- elif part['type'] == 'video' or 'video' in part %}{{- '<|vision_start|><|video_pad|><|vision_end|>' }}"
    "{%- elif 'text' in part %}{{- part['text'] }}{%- endif %}"
    "{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

PATCH_SIZE = 14
MERGE_SIZE = 2
# 28x28 .. 112x112 pixels: 1 to 16 language-model tokens per image (one per 2x2 merged patches)
MIN_PIXELS = (PATCH_SIZE * MERGE_SIZE) ** 2
MAX_PIXELS = 4 * 4 * MIN_PIXELS
ARCHS = ("qwen2_vl", "qwen2_5_vl")


def build_vl_processor(out_dir: str | Path, corpus: Iterable[str] | None = None, vocab_size: int = 512,
                       arch: str = "qwen2_vl") -> Any:
    """Tokenizer (byte-level BPE + ChatML + vision tokens) and the family's processor (`Qwen2VLProcessor`,
    `Qwen2_5_VLProcessor`: the same image processor), saved in `out_dir`."""
    from transformers import Qwen2_5_VLProcessor, Qwen2VLProcessor

    from rlpost.utils.vl_processor import allow_missing_video_processor

    allow_missing_video_processor()
    try:
        from transformers import Qwen2VLImageProcessorPil as ImageProcessor
    except ImportError:  # transformers without the PIL/torchvision split
        from transformers import Qwen2VLImageProcessor as ImageProcessor

    tok = build_tokenizer(out_dir, corpus, vocab_size)
    tok.add_tokens(VISION_TOKENS, special_tokens=True)
    tok.chat_template = VL_CHAT_TEMPLATE
    image_processor = ImageProcessor(patch_size=PATCH_SIZE, merge_size=MERGE_SIZE, temporal_patch_size=2,
                                     min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS,
                                     size={"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS})
    cls = Qwen2_5_VLProcessor if arch == "qwen2_5_vl" else Qwen2VLProcessor
    processor = cls(image_processor=image_processor, tokenizer=tok, chat_template=VL_CHAT_TEMPLATE)
    processor.save_pretrained(str(out_dir))
    tok.save_pretrained(str(out_dir))
    return processor


def tiny_vl_config(tok: Any, hidden_size: int = 128, num_layers: int = 2, num_heads: int = 2,
                   num_kv_heads: int = 1, intermediate_size: int = 256, vision_dim: int = 32,
                   vision_depth: int = 2, arch: str = "qwen2_vl") -> Any:
    """The tiny model's config (`Qwen2VLConfig` or `Qwen2_5_VLConfig`); `tok` gives the vocabulary and the
    vision token ids.

    Raises:
        ValueError: an `arch` not in `ARCHS`.
    """
    from transformers import Qwen2_5_VLConfig, Qwen2VLConfig

    if arch not in ARCHS:
        raise ValueError(f"arch={arch!r}: a tiny vision-language model is one of {list(ARCHS)}")
    head_dim = hidden_size // num_heads
    quarter = head_dim // 8  # mrope splits the head_dim/2 rotary frequencies over (time, height, width)
    ids = {t: tok.convert_tokens_to_ids(t) for t in VISION_TOKENS}
    text = dict(vocab_size=len(tok), hidden_size=hidden_size, intermediate_size=intermediate_size,
                num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
                max_position_embeddings=4096, tie_word_embeddings=True,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                 "mrope_section": [2 * quarter, quarter, quarter]},
                bos_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    vision: dict[str, Any] = dict(depth=vision_depth, num_heads=2, patch_size=PATCH_SIZE,
                                  spatial_merge_size=MERGE_SIZE, temporal_patch_size=2)
    if arch == "qwen2_vl":
        vision.update(embed_dim=vision_dim, hidden_size=hidden_size, mlp_ratio=2)
        cls = Qwen2VLConfig
    else:  # the window covers 2x2 merged patches: the 112x112 images hold 4 windows, smaller ones fewer
        vision.update(hidden_size=vision_dim, out_hidden_size=hidden_size, intermediate_size=2 * vision_dim,
                      window_size=PATCH_SIZE * MERGE_SIZE * 2, fullatt_block_indexes=[vision_depth - 1])
        cls = Qwen2_5_VLConfig
    return cls(text_config=text, vision_config=vision, image_token_id=ids["<|image_pad|>"],
               video_token_id=ids["<|video_pad|>"], vision_start_token_id=ids["<|vision_start|>"],
               vision_end_token_id=ids["<|vision_end|>"], tie_word_embeddings=True,
               bos_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
               pad_token_id=tok.pad_token_id, torch_dtype="float32")


def build_tiny_vl_model(out_dir: str | Path, corpus: Iterable[str] | None = None, vocab_size: int = 512,
                        seed: int = 0, arch: str = "qwen2_vl", **config_kwargs: Any) -> Path:
    """Save processor + tokenizer + a randomly initialised float32 model of `arch` (`ARCHS`) in `out_dir`;
    return it. `config_kwargs` go to `tiny_vl_config`."""
    import torch
    from transformers import AutoModelForImageTextToText

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    processor = build_vl_processor(out, corpus, vocab_size, arch)
    tok = processor.tokenizer
    config = tiny_vl_config(tok, arch=arch, **config_kwargs)
    torch.manual_seed(seed)
    model = AutoModelForImageTextToText.from_config(config).float()
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(str(out), safe_serialization=True)
    return out
