"""Prompt dataset for RL in verl's parquet format, and its collate function.

A row: `prompt` (list of chat messages), `data_source`, `reward_model: {style, ground_truth}`,
`extra_info` (dict). Everything that can be wrong with the files (missing file, missing column,
unsupported column, overlong prompt with `truncation=error`) fails at construction, before Ray starts.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from rlpost import keys

TRUNCATIONS = ("left", "right", "middle", "error")


def _cfg(config: Any, key: str, default: Any) -> Any:
    value = config.get(key, default) if config is not None else default
    return default if value is None else value


def _plain(value: Any) -> Any:
    """Parquet gives numpy arrays for lists; turn them (recursively) into Python lists/dicts."""
    if isinstance(value, np.ndarray):
        return [_plain(v) for v in value.tolist()]
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def read_parquet_files(files: str | list[str]) -> "Any":
    """Concatenate parquet files into one pandas DataFrame; a missing file is named in the error."""
    import pandas as pd

    files = [files] if isinstance(files, (str, Path)) else list(files)
    frames = []
    for f in files:
        if str(f).startswith("hdfs://"):
            raise ValueError(f"not supported yet: hdfs paths in data files ({f})")
        if not Path(f).is_file():
            raise FileNotFoundError(f"data file not found: {f}")
        frames.append(pd.read_parquet(f))
    if not frames:
        raise ValueError("no data files given")
    return pd.concat(frames, ignore_index=True)


def truncate(ids: list[int], max_len: int, mode: str, row: int) -> list[int]:
    """Cut `ids` to `max_len` tokens keeping the `left`-cut tail, the `right`-cut head, or both ends
    (`middle`); `error` raises naming the row and its length."""
    if len(ids) <= max_len:
        return ids
    if mode == "left":
        return ids[-max_len:]
    if mode == "right":
        return ids[:max_len]
    if mode == "middle":
        head = max_len // 2
        return ids[:head] + ids[len(ids) - (max_len - head) :]
    raise ValueError(
        f"data row {row}: prompt is {len(ids)} tokens, longer than data.max_prompt_length={max_len} "
        "(data.truncation=error); raise max_prompt_length, set data.filter_overlong_prompts=True, or "
        "choose truncation left/right/middle"
    )


class RLHFDataset(Dataset):
    """Chat prompts tokenized with the chat template and left-padded to `max_prompt_length`.

    Args:
        data_files: one parquet path or a list of them.
        tokenizer: a HF tokenizer with a chat template.
        config: the `data` config group (prompt_key, max_prompt_length, truncation, ...).
        processor: multimodal processor; not supported yet (must be None).
    """

    def __init__(self, data_files: str | list[str], tokenizer: Any, config: Any, processor: Any = None):
        if processor is not None:
            raise ValueError("not supported yet: multimodal processor for RLHFDataset")
        self.tokenizer = tokenizer
        self.prompt_key = _cfg(config, "prompt_key", "prompt")
        self.reward_fn_key = _cfg(config, "reward_fn_key", keys.DATA_SOURCE)
        self.max_prompt_length = int(_cfg(config, "max_prompt_length", 512))
        self.truncation = _cfg(config, "truncation", "error")
        self.return_raw_chat = bool(_cfg(config, "return_raw_chat", False))
        self.return_raw_input_ids = bool(_cfg(config, "return_raw_input_ids", False))
        self.return_full_prompt = bool(_cfg(config, "return_full_prompt", False))
        if self.truncation not in TRUNCATIONS:
            raise ValueError(f"data.truncation={self.truncation!r} must be one of {TRUNCATIONS}")
        if _cfg(config, "use_shm", False):
            raise ValueError("not supported yet: data.use_shm")
        self.data_files = data_files
        frame = read_parquet_files(data_files)
        self._check_columns(frame, config)
        self.rows = frame.to_dict("records")
        self.texts = [self._template(self._messages(r)) for r in self.rows]
        if _cfg(config, "filter_overlong_prompts", False):
            self._filter_overlong(int(_cfg(config, "filter_overlong_prompts_workers", 1)))

    def _check_columns(self, frame: Any, config: Any) -> None:
        columns = list(frame.columns)
        for key_name, column in (("data.prompt_key", self.prompt_key), ("data.reward_fn_key", self.reward_fn_key)):
            if column not in columns:
                raise KeyError(
                    f"{key_name}: column {column!r} not found in {self.data_files}; available columns: {columns}"
                )
        for key_name, default in (("image_key", "images"), ("video_key", "videos")):
            column = _cfg(config, key_name, default)
            if column in columns and frame[column].notna().any():
                raise ValueError(f"not supported yet: data.{key_name} (column {column!r} has data)")

    def _messages(self, row: dict) -> list[dict]:
        prompt = _plain(row[self.prompt_key])
        return [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt

    def _template(self, messages: list[dict]) -> str:
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)

    def _filter_overlong(self, workers: int) -> None:
        """Drop rows whose templated prompt is longer than max_prompt_length (token count)."""
        chunks = [self.texts[i : i + 1024] for i in range(0, len(self.texts), 1024)]

        def lengths(chunk: list[str]) -> list[int]:
            return [len(ids) for ids in self.tokenizer(chunk, add_special_tokens=False)["input_ids"]]

        # Fast tokenizers release the GIL, so threads are enough to use several cores.
        with ThreadPoolExecutor(max_workers=max(workers, 1)) as pool:
            all_lengths = [n for part in pool.map(lengths, chunks) for n in part]
        keep = [i for i, n in enumerate(all_lengths) if n <= self.max_prompt_length]
        self.rows = [self.rows[i] for i in keep]
        self.texts = [self.texts[i] for i in keep]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, item: int) -> dict[str, Any]:
        """One prompt: `input_ids`, `attention_mask`, `position_ids` (P,) left-padded to
        P = max_prompt_length; `raw_prompt_ids`, `data_source`/reward_fn_key, `reward_model`,
        `extra_info`, `index`; `raw_prompt`, `full_prompts`, `raw_input_ids` when asked."""
        row = self.rows[item]
        ids = self.tokenizer(self.texts[item], add_special_tokens=False)["input_ids"]
        ids = truncate(ids, self.max_prompt_length, self.truncation, item)
        pad = self.max_prompt_length - len(ids)
        input_ids = torch.tensor([self.tokenizer.pad_token_id] * pad + ids, dtype=torch.long)
        attention_mask = torch.tensor([0] * pad + [1] * len(ids), dtype=torch.long)
        extra_info = _plain(row.get(keys.EXTRA_INFO)) or {}
        out = {
            keys.INPUT_IDS: input_ids,
            keys.ATTENTION_MASK: attention_mask,
            keys.POSITION_IDS: torch.clamp(attention_mask.cumsum(-1) - 1, min=0),
            keys.RAW_PROMPT_IDS: list(ids),
            self.reward_fn_key: row[self.reward_fn_key],
            keys.REWARD_MODEL: _plain(row.get(keys.REWARD_MODEL)) or {},
            keys.EXTRA_INFO: extra_info,
            keys.INDEX: extra_info.get("index", item) if isinstance(extra_info, dict) else item,
        }
        if keys.DATA_SOURCE in row:
            out[keys.DATA_SOURCE] = row[keys.DATA_SOURCE]
        if self.return_raw_chat:
            out[keys.RAW_PROMPT] = self._messages(row)
        if self.return_full_prompt:
            out[keys.FULL_PROMPTS] = self.texts[item]
        if self.return_raw_input_ids:
            contents = "\n".join(str(m["content"]) for m in self._messages(row))
            raw = self.tokenizer(contents, add_special_tokens=False)["input_ids"]
            out[keys.RAW_INPUT_IDS] = truncate(raw, self.max_prompt_length, self.truncation, item)
        return out


def collate_fn(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Stack tensors to (B, ...) and put every other field in a 1-D numpy object array of length B."""
    out: dict[str, Any] = {}
    for key in samples[0]:
        values = [s[key] for s in samples]
        if isinstance(values[0], torch.Tensor):
            out[key] = torch.stack(values)
        else:
            array = np.empty(len(values), dtype=object)
            array[:] = values
            out[key] = array
    return out


def load_dataset_class(path: str, name: str) -> type:
    """The user `Dataset` subclass `name` defined in the file `path` (data.custom_cls)."""
    from rlpost.reward.custom import load_function_from_file

    cls = load_function_from_file(path, name, config_key="data.custom_cls")
    if not (isinstance(cls, type) and issubclass(cls, Dataset)):
        raise TypeError(f"data.custom_cls: {name} in {path} must be a subclass of torch.utils.data.Dataset")
    return cls


def create_rl_dataset(data_files: str | list[str], data_config: Any, tokenizer: Any, processor: Any = None) -> Dataset:
    """Build the dataset: `data.custom_cls` if set (same constructor signature), else `RLHFDataset`.
    `data.tokenizer` (a path) replaces `tokenizer` when set."""
    tokenizer_path = _cfg(data_config, "tokenizer", None)
    if tokenizer_path:
        from transformers import AutoTokenizer

        trust = bool(_cfg(data_config, "trust_remote_code", False))
        tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_path), trust_remote_code=trust)
    custom = _cfg(data_config, "custom_cls", None)
    cls = RLHFDataset
    if custom is not None and custom.get("path"):
        cls = load_dataset_class(custom.get("path"), custom.get("name") or "")
    return cls(data_files, tokenizer, data_config, processor)
