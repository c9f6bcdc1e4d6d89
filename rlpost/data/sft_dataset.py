"""Single-turn SFT dataset: prompt/response pairs from parquet files, tokenised for next-token loss.

Each row becomes one right-padded sequence of `data.max_length` tokens:
`chat_template(prompt, tools=<row's tools>, add_generation_prompt=True) + response + eos`; the prompt may be
a string or a list of chat messages (e.g. a conversation with a tool call and its result), and the tools
come from the `data.tools_key` column when set. The loss mask is 1 on the
response tokens (EOS included) and 0 on the prompt and the padding, so only the answer is learned.

With `data.image_key` set, rows are verl's multi-modal rows (one `<image>` in the prompt per image, the images
column as in `rlpost.data.multimodal`): the model's processor renders the prompt, each image becomes its vision
tokens, and the item carries the row's `multi_modal_inputs` (pixel_values, image_grid_thw); `collate` keeps
those as a per-row list (their patch counts differ between rows).
"""

from __future__ import annotations

import json
from typing import Any, Sequence

import pandas as pd
import torch

from torch.utils.data import Dataset

from rlpost import keys
from rlpost.data.multimodal import MultiModalEncoder
from rlpost.keys import ATTENTION_MASK, INPUT_IDS, MULTI_MODAL_INPUTS, POSITION_IDS

TRUNCATION_MODES = ("error", "left", "right")


def _as_list(files: str | Sequence[str]) -> list[str]:
    """Accept one path or a list of paths (Hydra gives a ListConfig)."""
    if isinstance(files, str):
        return [files]
    return [str(f) for f in files]


def _dig(value: Any, dict_keys: Sequence[str] | None) -> Any:
    """Follow `dict_keys` into nested dict columns, e.g. row["extra"]["question"]."""
    for key in dict_keys or []:
        value = value[key]
    return value


def _to_messages(prompt: Any) -> list[dict]:
    """A plain string becomes one user turn; a chat list (numpy array from parquet) stays a chat."""
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    return [_plain(dict(m)) for m in prompt]


def _tool_list(tools: Any) -> list[dict] | None:
    """A row's tool schemas: a JSON string or a list of dicts (None or empty: no tools)."""
    if tools is None or (isinstance(tools, str) and not tools.strip()):
        return None
    if isinstance(tools, str):
        tools = json.loads(tools)
    return [_plain(t) for t in tools] or None


def _plain(value: Any) -> Any:
    """Parquet gives numpy arrays for lists; turn them (recursively) into Python lists/dicts."""
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        value = value.tolist()
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


class SFTDataset(Dataset):
    """Prompt/response pairs for supervised fine-tuning.

    Args:
        parquet_files: One path or a list of parquet paths.
        tokenizer: A HF tokenizer with a chat template and an EOS token.
        config: The `data` config group; reads prompt_key, response_key, prompt_dict_keys,
            response_dict_keys, tools_key, image_key, max_length, truncation.
        processor: The model's multimodal processor (`rlpost.utils.tokenizer.hf_processor`); needed when
            `config.image_key` is set.

    Items are dicts of tensors, each of shape (L,) with L = max_length: `input_ids`,
    `attention_mask`, `position_ids`, `loss_mask`; with `image_key` also `multi_modal_inputs` (a dict).

    Raises:
        MultiModalRowError: (image_key set) a row whose images cannot be read or whose `<image>` count differs
            from its image count, naming the file and the row.
    """

    def __init__(self, parquet_files: str | Sequence[str], tokenizer, config, processor: Any = None) -> None:
        self.tokenizer = tokenizer
        self.max_length = int(config.max_length)
        self.truncation = config.truncation
        if self.truncation not in TRUNCATION_MODES:
            raise ValueError(
                f"data.truncation={self.truncation!r} is not valid: use one of {TRUNCATION_MODES}"
            )
        if tokenizer.eos_token_id is None or tokenizer.pad_token_id is None:
            raise ValueError("the tokenizer needs an eos_token and a pad_token for SFT")
        frames = [pd.read_parquet(f) for f in _as_list(parquet_files)]
        frame = pd.concat(frames, ignore_index=True)
        for key in (config.prompt_key, config.response_key):
            if key not in frame.columns:
                raise KeyError(f"column {key!r} not in {list(frame.columns)} (data.prompt_key/response_key)")
        self.prompts = [_dig(p, config.prompt_dict_keys) for p in frame[config.prompt_key]]
        self.responses = [_dig(r, config.response_dict_keys) for r in frame[config.response_key]]
        self.tools: list[Any] = [None] * len(self.prompts)
        if config.tools_key is not None:
            if config.tools_key not in frame.columns:
                raise KeyError(f"data.tools_key: column {config.tools_key!r} not in {list(frame.columns)}")
            self.tools = [_tool_list(t) for t in frame[config.tools_key]]
        self.encoder, self.images = None, None
        if config.image_key is not None:
            where = [f"{f} row {i}" for f, part in zip(_as_list(parquet_files), frames) for i in range(len(part))]
            self._load_images(frame, config.image_key, processor, where)

    def _load_images(self, frame: pd.DataFrame, image_key: str, processor: Any, where: list[str]) -> None:
        """Decode every row's images once (bad rows stop here, before training, naming file and row)."""
        if processor is None:
            raise ValueError(f"data.image_key={image_key!r} needs the model's processor (a Qwen2-VL-family model "
                             "folder with preprocessor_config.json); set data.image_key=null for a text model")
        if image_key not in frame.columns:
            raise KeyError(f"data.image_key: column {image_key!r} not in {list(frame.columns)}")
        self.encoder = MultiModalEncoder(processor, {}, {})
        self.images = [self.encoder.images(column, _to_messages(prompt), at)
                       for column, prompt, at in zip(frame[image_key], self.prompts, where)]

    def __len__(self) -> int:
        return len(self.prompts)

    def _truncate(self, ids: list[int], mask: list[int], index: int) -> tuple[list[int], list[int]]:
        if len(ids) <= self.max_length:
            return ids, mask
        if self.truncation == "left":
            return ids[-self.max_length :], mask[-self.max_length :]
        if self.truncation == "right":
            return ids[: self.max_length], mask[: self.max_length]
        raise ValueError(
            f"row {index} has {len(ids)} tokens > data.max_length={self.max_length}; raise max_length "
            "or set data.truncation to 'left' or 'right'"
        )

    def _prompt(self, index: int) -> tuple[list[int], dict[str, Any] | None]:
        """The row's prompt ids (vision tokens expanded) and its multi_modal_inputs (None without image_key)."""
        messages = _to_messages(self.prompts[index])
        if self.encoder is not None:
            text = self.encoder.template(messages)
            ids, _, mm = self.encoder.encode(text, self.images[index])
            return ids, mm
        tok = self.tokenizer
        text = tok.apply_chat_template(messages, tools=self.tools[index], add_generation_prompt=True, tokenize=False)
        return tok(text, add_special_tokens=False)["input_ids"], None

    def __getitem__(self, index: int) -> dict[str, Any]:
        tok = self.tokenizer
        prompt_ids, mm = self._prompt(index)
        response_ids = tok(str(self.responses[index]), add_special_tokens=False)["input_ids"]
        response_ids = response_ids + [tok.eos_token_id]
        ids = prompt_ids + response_ids
        loss = [0] * len(prompt_ids) + [1] * len(response_ids)
        if mm and len(ids) > self.max_length:  # cutting vision tokens would part them from their pixels
            raise ValueError(f"row {index} has {len(ids)} tokens (vision tokens included) > data.max_length="
                             f"{self.max_length}; rows with images are not truncated: raise data.max_length")
        ids, loss = self._truncate(ids, loss, index)
        n_pad = self.max_length - len(ids)
        attn = [1] * len(ids) + [0] * n_pad
        positions = list(range(len(ids))) + [0] * n_pad
        item: dict[str, Any] = {
            INPUT_IDS: torch.tensor(ids + [tok.pad_token_id] * n_pad, dtype=torch.long),
            ATTENTION_MASK: torch.tensor(attn, dtype=torch.long),
            POSITION_IDS: torch.tensor(positions, dtype=torch.long),
            keys.LOSS_MASK: torch.tensor(loss + [0] * n_pad, dtype=torch.long),
        }
        if mm is not None:
            item[MULTI_MODAL_INPUTS] = mm
        return item


def collate(items: list[dict[str, Any]]) -> dict[str, Any]:
    """Stack the (L,) tensors of `items` into (b, L); `multi_modal_inputs` stays a list of b dicts."""
    out: dict[str, Any] = {k: torch.stack([it[k] for it in items]) for k in items[0] if k != MULTI_MODAL_INPUTS}
    if MULTI_MODAL_INPUTS in items[0]:
        out[MULTI_MODAL_INPUTS] = [it[MULTI_MODAL_INPUTS] for it in items]
    return out
