"""Prompt dataset for RL in verl's parquet format, and its collate function.

A row: `prompt` (list of chat messages), `data_source`, `reward_model: {style, ground_truth}`,
`extra_info` (dict; its `tools_kwargs` and `interaction_kwargs` feed multi-turn rollouts), and optionally
`agent_name` (the agent loop of the row). Everything that can be wrong with the files (missing file, missing column,
unsupported column, overlong prompt with `truncation=error`) fails at construction, before Ray starts.
Config: the `data` group, read by attribute (the composed DictConfig or the typed `DataConfig`).
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from rlpost import keys
from rlpost.data.multimodal import MultiModalEncoder
from rlpost.utils.shm import copy_to_shm

TRUNCATIONS = ("left", "right", "middle", "error")


logger = logging.getLogger(__name__)

def _plain(value: Any) -> Any:
    """Parquet gives numpy arrays for lists; turn them (recursively) into Python lists/dicts."""
    if isinstance(value, np.ndarray):
        return [_plain(v) for v in value.tolist()]
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def read_parquet_files(files: str | list[str], use_shm: bool = False) -> "Any":
    """Concatenate parquet files into one pandas DataFrame; a missing file is named in the error.
    `use_shm` (`data.use_shm`): each file is read from its /dev/shm copy (`rlpost.utils.shm`)."""
    import pandas as pd

    files = [files] if isinstance(files, (str, Path)) else list(files)
    frames = []
    for f in files:
        if str(f).startswith("hdfs://"):
            raise ValueError(f"not supported yet: hdfs paths in data files ({f})")
        if not Path(f).is_file():
            raise FileNotFoundError(f"data file not found: {f}")
        try:
            frames.append(pd.read_parquet(copy_to_shm(f) if use_shm else f))
        except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid is a ValueError
            raise ValueError(f"data file {f} cannot be read as parquet ({exc}); data files must be parquet, "
                             "e.g. made by examples/data_preprocess/gsm8k.py") from exc
    if not frames:
        raise ValueError("no data files given")
    frame = pd.concat(frames, ignore_index=True)
    frame.attrs["file_rows"] = [(str(f), len(part)) for f, part in zip(files, frames)]  # to name a row's file
    return frame


def row_origin(file_rows: list[tuple[str, int]], row: int) -> tuple[str, int]:
    """(file, row within that file) of row `row` of the concatenated files."""
    for path, n in file_rows:
        if row < n:
            return path, row
        row -= n
    raise IndexError(row)


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
        config: the `data` config group (prompt_key, max_prompt_length, truncation, apply_chat_template_kwargs,
            ...).
        processor: the model's multimodal processor (`rlpost.utils.tokenizer.hf_processor`), needed by rows
            with images (`data.image_key`; `rlpost.data.multimodal`); None for a text-only model.
        max_samples: keep only the first `max_samples` rows of the files (before any filtering); -1: all.
    """

    def __init__(self, data_files: str | list[str], tokenizer: Any, config: Any, processor: Any = None,
                 max_samples: int = -1):
        self.tokenizer = tokenizer
        self.prompt_key = config.prompt_key
        self.reward_fn_key = config.reward_fn_key
        self.max_prompt_length = int(config.max_prompt_length)
        self.truncation = config.truncation
        self.return_raw_chat = bool(config.return_raw_chat)
        self.return_raw_input_ids = bool(config.return_raw_input_ids)
        self.return_full_prompt = bool(config.return_full_prompt)
        # e.g. {enable_thinking: false}: passed to every apply_chat_template call on the prompts
        self.chat_template_kwargs = _plain_mapping(config.apply_chat_template_kwargs)
        # Tool schemas rendered into every prompt, as the tool agent renders it, so prompt lengths count them.
        self.tool_schemas = _tool_schemas(config.tool_config_path)
        if self.truncation not in TRUNCATIONS:
            raise ValueError(f"data.truncation={self.truncation!r} must be one of {TRUNCATIONS}")
        self.data_files = data_files
        frame = read_parquet_files(data_files, bool(config.use_shm))
        self.file_rows = frame.attrs["file_rows"]
        if max_samples > 0:
            frame = frame.iloc[:max_samples]
        self._check_columns(frame, config)
        self.rows = frame.to_dict("records")
        self.mm = mm_encoder(frame, config, processor, self.chat_template_kwargs, data_files)
        self.image_key = config.image_key
        self.return_multi_modal_inputs = bool(config.return_multi_modal_inputs)
        self.has_agent_name = keys.AGENT_NAME in frame.columns
        self._check_response_caps()
        self.row_ids = list(range(len(self.rows)))  # each kept row's index in the files (names it in errors)
        self.texts = [self._template(self._checked_messages(i, r)) for i, r in enumerate(self.rows)]
        self._check_empty_prompts()
        workers = int(config.filter_overlong_prompts_workers)
        if config.filter_overlong_prompts:
            self._filter_overlong(workers)
        elif self.truncation == "error" or self.mm is not None:  # vision tokens cannot be cut
            self._check_lengths(workers)

    def _check_columns(self, frame: Any, config: Any) -> None:
        columns = list(frame.columns)
        for key_name, column in (("data.prompt_key", self.prompt_key), ("data.reward_fn_key", self.reward_fn_key)):
            if column not in columns:
                raise KeyError(
                    f"{key_name}: column {column!r} not found in {self.data_files}; available columns: {columns}"
                )
        for key_name, column in (("video_key", config.video_key), ("audio_key", config.audio_key)):
            if column in columns and frame[column].notna().any():
                raise ValueError(f"not supported yet: data.{key_name} (column {column!r} has data)")

    def _check_response_caps(self) -> None:
        """`extra_info.response_caps` in every row or in none (rows are batched together), each a valid list."""
        has = [isinstance(e, dict) and e.get(keys.RESPONSE_CAPS) is not None  # parquet fills missing keys with None
               for e in (_plain(r.get(keys.EXTRA_INFO)) for r in self.rows)]
        if not any(has):
            return
        for i, row in enumerate(self.rows):
            path, file_row = row_origin(self.file_rows, i)
            if not has[i]:
                raise ValueError(f"{path} row {file_row}: extra_info has no response_caps while other rows have "
                                 "them; give every row its per-sample caps (e.g. [240, 512]) or none")
            try:
                response_caps(_plain(row[keys.EXTRA_INFO])[keys.RESPONSE_CAPS], file_row)
            except ValueError as exc:
                raise ValueError(f"{path}: {exc}") from None

    def _messages(self, row: dict) -> list[dict]:
        prompt = _plain(row[self.prompt_key])
        return [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt

    def _checked_messages(self, index: int, row: dict) -> list[dict]:
        """The row's chat messages; a prompt that is not text or a list of {role, content: text} messages
        raises naming its file and row (instead of a chat-template error that names neither)."""
        messages = self._messages(row)
        problem = None
        if not isinstance(messages, list) or not messages:
            problem = f"is {type(messages).__name__} {messages!r:.80}, not text or a non-empty list of messages"
        else:
            for j, message in enumerate(messages):
                if not isinstance(message, dict) or not isinstance(message.get("role"), str):
                    problem = f"message {j} has no 'role': {message!r:.80}"
                elif not isinstance(message.get("content"), str) and not message.get("tool_calls"):
                    problem = f"message {j} (role {message['role']!r}) has no text 'content': {message!r:.80}"
                if problem:
                    break
        if problem is None:
            return messages
        path, file_row = row_origin(self.file_rows, index)
        raise ValueError(f"{path} row {file_row}: the {self.prompt_key!r} column (data.prompt_key) {problem}; "
                         "each prompt must be a string or a list of {'role': ..., 'content': '<text>'} messages")

    def _check_empty_prompts(self) -> None:
        """Rows whose user messages hold no text (`""`, or whitespace) are warned, with the first file and row; a
        data set of nothing else is refused: the model would be trained on answers to nothing."""
        empty = [i for i, r in enumerate(self.rows)
                 if not any(str(m.get("content") or "").strip() for m in self._messages(r) if m["role"] == "user")]
        if not empty:
            return
        path, row = row_origin(self.file_rows, empty[0])
        what = (f"{len(empty)} of {len(self.rows)} rows of {self.data_files} have a prompt without text (no user "
                f"message with non-empty 'content' in the {self.prompt_key!r} column, data.prompt_key; the first: "
                f"{path} row {row})")
        if len(empty) == len(self.rows):
            raise ValueError(f"{what}: nothing to train on; fill the prompts, or point data.prompt_key at the "
                             "column that holds them")
        logger.warning("%s; they are kept (drop them from the file if they are a mistake)", what)

    def _template(self, messages: list[dict]) -> str:
        if self.mm is not None:
            return self.mm.template(messages)
        return self.tokenizer.apply_chat_template(messages, tools=self.tool_schemas, add_generation_prompt=True,
                                                  tokenize=False, **self.chat_template_kwargs)

    def _row_images(self, item: int) -> list[Any]:
        """The PIL images of row `item` (checked against its placeholders), [] for a text dataset."""
        if self.mm is None:
            return []
        path, file_row = row_origin(self.file_rows, self.row_ids[item])
        return self.mm.images(self.rows[item].get(self.image_key), self._messages(self.rows[item]),
                              f"{path} row {file_row}")

    def _prompt_lengths(self, workers: int) -> list[int]:
        """Token count of every templated prompt (with images: their vision tokens included)."""
        if self.mm is not None:  # every image is read here: a bad one stops the run before Ray
            return [self.mm.prompt_length(t, self._row_images(i)) for i, t in enumerate(self.texts)]
        chunks = [self.texts[i : i + 1024] for i in range(0, len(self.texts), 1024)]

        def lengths(chunk: list[str]) -> list[int]:
            return [len(ids) for ids in self.tokenizer(chunk, add_special_tokens=False)["input_ids"]]

        # Fast tokenizers release the GIL, so threads are enough to use several cores.
        with ThreadPoolExecutor(max_workers=max(workers, 1)) as pool:
            return [n for part in pool.map(lengths, chunks) for n in part]

    def _check_lengths(self, workers: int) -> None:
        """With truncation=error, fail now on any over-long prompt instead of when its batch is drawn."""
        lengths = self._prompt_lengths(workers)
        over = [i for i, n in enumerate(lengths) if n > self.max_prompt_length]
        if not over:
            return
        path, row = row_origin(self.file_rows, over[0])
        why = "vision tokens included, which no truncation may cut" if self.mm else "data.truncation=error"
        raise ValueError(
            f"{path} row {row}: prompt is {lengths[over[0]]} tokens, longer than data.max_prompt_length="
            f"{self.max_prompt_length} ({why}); {len(over)} of {len(lengths)} prompts are "
            f"over, the longest {max(lengths)} tokens. Set data.max_prompt_length={max(lengths)}, "
            f"data.filter_overlong_prompts=true (drops them), or data.truncation=left"
        )

    def _filter_overlong(self, workers: int) -> None:
        """Drop rows whose templated prompt is longer than max_prompt_length (token count)."""
        all_lengths = self._prompt_lengths(workers)
        keep = [i for i, n in enumerate(all_lengths) if n <= self.max_prompt_length]
        dropped = len(all_lengths) - len(keep)
        if dropped:  # silently smaller data would skew epochs and schedules; say how much went
            logger.warning("data.filter_overlong_prompts: dropped %d of %d rows of %s (prompts longer than "
                           "data.max_prompt_length=%d tokens; the longest has %d)", dropped, len(all_lengths),
                           self.data_files, self.max_prompt_length, max(all_lengths))
        self.rows = [self.rows[i] for i in keep]
        self.texts = [self.texts[i] for i in keep]
        self.row_ids = [self.row_ids[i] for i in keep]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, item: int) -> dict[str, Any]:
        """One prompt: `input_ids`, `attention_mask`, `position_ids` (P,) left-padded to
        P = max_prompt_length; `raw_prompt_ids`, `data_source`/reward_fn_key, `reward_model`,
        `extra_info`, `index`, `tools_kwargs` and `interaction_kwargs` (from extra_info, {} when absent);
        `agent_name` when the files have that column; `raw_prompt`, `full_prompts`, `raw_input_ids` when
        asked."""
        row = self.rows[item]
        images = self._row_images(item)
        if self.mm is not None:  # lengths were checked at start-up: nothing to truncate
            ids, raw_ids, mm_inputs = self.mm.encode(self.texts[item], images)
        else:
            ids = self.tokenizer(self.texts[item], add_special_tokens=False)["input_ids"]
            ids = raw_ids = truncate(ids, self.max_prompt_length, self.truncation, item)
        pad = self.max_prompt_length - len(ids)
        input_ids = torch.tensor([self.tokenizer.pad_token_id] * pad + ids, dtype=torch.long)
        attention_mask = torch.tensor([0] * pad + [1] * len(ids), dtype=torch.long)
        extra_info = _plain(row.get(keys.EXTRA_INFO)) or {}
        out = {
            keys.INPUT_IDS: input_ids,
            keys.ATTENTION_MASK: attention_mask,
            keys.POSITION_IDS: torch.clamp(attention_mask.cumsum(-1) - 1, min=0),
            keys.RAW_PROMPT_IDS: list(raw_ids),
            self.reward_fn_key: row[self.reward_fn_key],
            keys.REWARD_MODEL: _plain(row.get(keys.REWARD_MODEL)) or {},
            keys.EXTRA_INFO: extra_info,
            keys.INDEX: extra_info.get("index", item) if isinstance(extra_info, dict) else item,
            keys.TOOLS_KWARGS: _extra(extra_info, keys.TOOLS_KWARGS),
            keys.INTERACTION_KWARGS: _extra(extra_info, keys.INTERACTION_KWARGS),
        }
        if isinstance(extra_info, dict) and extra_info.get(keys.RESPONSE_CAPS) is not None:
            out[keys.RESPONSE_CAPS] = response_caps(extra_info[keys.RESPONSE_CAPS], item)
        if self.mm is not None:
            out[keys.MULTI_MODAL_DATA] = {"image": images} if images else {}
            if self.return_multi_modal_inputs:
                out[keys.MULTI_MODAL_INPUTS] = mm_inputs
        if self.has_agent_name:
            out[keys.AGENT_NAME] = row[keys.AGENT_NAME]
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


def response_caps(value: Any, item: int) -> list[int]:
    """`extra_info.response_caps` of row `item` as a list of positive ints (sample j of the prompt's group is
    cut at caps[j % len(caps)] tokens); anything else is refused with the row named."""
    caps = list(value) if isinstance(value, (list, tuple, np.ndarray)) else None
    if not caps or any(not isinstance(c, (int, np.integer)) or isinstance(c, bool) or c < 1 for c in caps):
        raise ValueError(f"data row {item}: extra_info.response_caps={value!r} must be a non-empty list of "
                         "positive ints (per-sample response caps), e.g. [240, 512]")
    return [int(c) for c in caps]


def mm_encoder(frame: Any, config: Any, processor: Any, chat_template_kwargs: dict,
               data_files: Any) -> MultiModalEncoder | None:
    """The processor front for files whose images column (`data.image_key`) holds data, else None.

    Raises:
        ValueError: images for a model without a multimodal processor (a text-only model).
    """
    column = config.image_key
    if not column or column not in frame.columns or not frame[column].map(lambda v: len(_plain(v) or [])).any():
        return None
    if processor is None or not hasattr(processor, "image_processor"):
        raise ValueError(f"{data_files}: the {column!r} column (data.image_key) holds images, but the model "
                         "has no multimodal processor (a text-only model); use a vision-language model "
                         "(e.g. Qwen2-VL) or drop the column / set data.image_key=null")
    if not config.return_multi_modal_inputs:
        raise ValueError(f"not supported yet: data.return_multi_modal_inputs=false with images in {data_files} "
                         "(the actor reads each row's pixels from them); set it to true")
    return MultiModalEncoder(processor, _plain_mapping(config.mm_processor_kwargs), chat_template_kwargs)


def _extra(extra_info: Any, key: str) -> dict:
    """extra_info[key] as a dict ({} when absent)."""
    value = extra_info.get(key) if isinstance(extra_info, dict) else None
    return dict(value or {})


def _tool_schemas(tool_config_path: str | None) -> list[dict] | None:
    """OpenAI function schemas of the tools YAML (None without one); a bad entry raises `ConfigEntryError`
    naming it."""
    if not tool_config_path:
        return None
    from rlpost.tools.utils.tool_registry import tools_by_name

    return [tool.tool_schema.model_dump() for tool in tools_by_name(tool_config_path).values()] or None


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


def _plain_mapping(value: Any) -> dict[str, Any]:
    """A free-form mapping of the config (DictConfig or dict) as a plain dict."""
    from omegaconf import OmegaConf

    return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else dict(value)


def load_extern_class(class_path: str, class_name: str, config_key: str, path_field: str = "path",
                      name_field: str = "name") -> type:
    """The class `class_name` of a user file or module (`rlpost.utils.import_utils.load_extern_object`: `pkg://a.b.c`
    or `pkg://a/b/c`, `file:///abs/x.py` or a plain path). Errors name `{config_key}.{path_field}` /
    `{config_key}.{name_field}`."""
    from rlpost.utils.import_utils import UserCodeError, load_extern_object

    cls = load_extern_object(class_path, class_name, config_key, path_field, name_field)
    if not isinstance(cls, type):
        raise UserCodeError(f"{config_key}.{name_field}: {class_name!r} in {class_path} is not a class")
    return cls


def load_dataset_class(path: str, name: str) -> type:
    """The user `Dataset` subclass `name` defined in `path` (data.custom_cls; a file, or `pkg://module`)."""
    cls = load_extern_class(path, name, "data.custom_cls")
    if not (isinstance(cls, type) and issubclass(cls, Dataset)):
        raise TypeError(f"data.custom_cls: {name} in {path} must be a subclass of torch.utils.data.Dataset")
    return cls


def create_rl_dataset(data_files: str | list[str], data_config: Any, tokenizer: Any, processor: Any = None,
                      is_train: bool = True) -> Dataset:
    """Build the dataset: `data.custom_cls` if set, else `RLHFDataset`; both are called as
    `cls(data_files, tokenizer, data_config, processor, max_samples=...)` (verl's signature), with
    `data.train_max_samples` (is_train) or `data.val_max_samples`. `data.tokenizer` (a path) replaces
    `tokenizer` when set."""
    if data_config.tokenizer:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(data_config.tokenizer),
                                                  trust_remote_code=bool(data_config.trust_remote_code))
    custom = data_config.custom_cls
    cls = load_dataset_class(custom.path, custom.name) if custom.path else RLHFDataset
    max_samples = data_config.train_max_samples if is_train else data_config.val_max_samples
    return cls(data_files, tokenizer, data_config, processor, max_samples=int(max_samples))
