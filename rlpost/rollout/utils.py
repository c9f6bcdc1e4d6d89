"""Engine-neutral helpers: strip prompt padding, pad responses, build masks and the output batch; engine
load formats and weight buckets."""

from __future__ import annotations

from typing import Any, Iterable, Iterator, Sequence

import numpy as np
import torch

from rlpost import keys
from rlpost.protocol import DataProto


_DISK_FORMATS = {"hf": "auto", "auto": "auto", "safetensors": "safetensors", "pt": "pt"}


def load_format_name(value: str) -> str:
    """verl's `rollout.load_format` -> the name vLLM and SGLang share: `dummy_*` start from random weights
    (the actor's arrive by sync), `hf` reads the checkpoint.

    Raises:
        ValueError: a format neither engine reads here.
    """
    if value.startswith("dummy"):
        return "dummy"
    if value in _DISK_FORMATS:
        return _DISK_FORMATS[value]
    raise ValueError(
        f"actor_rollout_ref.rollout.load_format={value!r} is not supported: use dummy_dtensor "
        f"(random init, weights synced from the actor) or one of {sorted(_DISK_FORMATS)}"
    )


def max_model_len(config: Any) -> int:
    """The engine's context length: `rollout.max_model_len`, or prompt_length + response_length when null."""
    if config.max_model_len is not None:
        return int(config.max_model_len)
    return config.prompt_length + config.response_length


def engine_seed(config: Any, engine_kwargs_seed: Any = None) -> int:
    """Base seed of the engine's sampling: `rollout.seed`, else the seed given in the engine's own
    `engine_kwargs`, else 0.

    Raises:
        ValueError: both are set and disagree (naming both keys).
    """
    if config.seed is None:
        return int(engine_kwargs_seed or 0)
    if engine_kwargs_seed is not None and int(engine_kwargs_seed) != int(config.seed):
        raise ValueError(f"actor_rollout_ref.rollout.seed={config.seed} and the engine_kwargs seed "
                         f"{engine_kwargs_seed} disagree; set one of them")
    return int(config.seed)


def tensor_buckets(named_tensors: Iterable[tuple[str, torch.Tensor]],
                   max_bytes: int) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Group (name, tensor) pairs in order into lists of at most `max_bytes` (a larger tensor goes alone).

    Bounds what a bucketed weight sync keeps alive at once: the tensors of one bucket."""
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, tensor in named_tensors:
        nbytes = tensor.numel() * tensor.element_size()
        if bucket and size + nbytes > max_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += nbytes
    if bucket:
        yield bucket


def eos_id_set(eos_token_id: int | Sequence[int] | None) -> set[int]:
    """meta_info `eos_token_id` may be an int or a list (e.g. several stop tokens); return a set."""
    if eos_token_id is None:
        return set()
    if isinstance(eos_token_id, (list, tuple, set, np.ndarray, torch.Tensor)):
        return {int(t) for t in eos_token_id}
    return {int(eos_token_id)}


def prompt_token_lists(prompts: DataProto) -> list[list[int]]:
    """Unpadded prompt ids per row: non-tensor `raw_prompt_ids` when present, else the ids under
    `attention_mask` (B,P) == 1 (left padding removed)."""
    raw = prompts.non_tensor_batch.get(keys.RAW_PROMPT_IDS) if prompts.non_tensor_batch else None
    if raw is not None:
        return [list(map(int, row)) for row in raw]
    ids, mask = prompts.batch[keys.INPUT_IDS], prompts.batch[keys.ATTENTION_MASK]
    return [row[m.bool()].tolist() for row, m in zip(ids, mask)]


def row_caps(prompts: DataProto, max_tokens: int) -> list[int] | None:
    """Each row's response cap, from the non-tensor `response_caps` (one list per prompt, repeated over its
    group): the j-th row of a uid takes caps[j % len(caps)], at most `max_tokens`. None without the field.

    A group split over several generation calls starts again at caps[0] in each call."""
    caps = prompts.non_tensor_batch.get(keys.RESPONSE_CAPS) if prompts.non_tensor_batch else None
    if caps is None:
        return None
    uids = prompts.non_tensor_batch.get(keys.UID)
    seen: dict[Any, int] = {}
    out = []
    for i, row in enumerate(caps):
        key = uids[i] if uids is not None else i
        j = seen.get(key, 0)
        seen[key] = j + 1
        out.append(min(int(row[j % len(row)]), max_tokens))
    return out


def pad_2d(rows: Sequence[Sequence[float]], length: int, pad_value: float, dtype: torch.dtype) -> torch.Tensor:
    """Right-pad (and truncate) ragged rows to a (len(rows), length) tensor."""
    out = torch.full((len(rows), length), pad_value, dtype=dtype)
    for i, row in enumerate(rows):
        n = min(len(row), length)
        if n:
            out[i, :n] = torch.as_tensor(list(row[:n]), dtype=dtype)
    return out


def response_mask_from(responses: torch.Tensor, lengths: torch.Tensor, eos_ids: set[int]) -> torch.Tensor:
    """1 on generated tokens up to and including the first EOS, 0 after it and on padding.

    Args:
        responses: (B,R) right-padded response ids.
        lengths: (B,) number of tokens the engine generated per row.
        eos_ids: ids that end a response.

    Returns:
        (B,R) int64 mask.
    """
    B, R = responses.shape
    pos = torch.arange(R).expand(B, R)
    mask = pos < lengths.unsqueeze(1)
    if eos_ids:
        is_eos = torch.isin(responses, torch.tensor(sorted(eos_ids))) & mask
        # positions strictly after the first EOS: cumulative count of EOS before this position > 0
        eos_before = torch.cumsum(is_eos.long(), dim=1) - is_eos.long()
        mask = mask & (eos_before == 0)
    return mask.long()


def assemble_output(
    prompts: DataProto,
    response_ids: Sequence[Sequence[int]],
    response_length: int,
    log_probs: Sequence[Sequence[float]] | None = None,
) -> DataProto:
    """Build the rollout output batch from ragged engine outputs (one response per input row).

    Args:
        prompts: the input batch; `input_ids`/`attention_mask`/`position_ids` (B,P) left-padded,
            meta_info `eos_token_id`, `pad_token_id`.
        response_ids: B lists of generated ids (EOS included when generation stopped on it).
        response_length: R; longer responses are truncated, shorter right-padded with pad id.
        log_probs: B lists of per-token log-probs of the sampled tokens, or None.

    Returns:
        DataProto with `prompts` (B,P), `responses` (B,R), `input_ids`/`attention_mask`/`position_ids`
        (B,P+R), `response_mask` (B,R), `rollout_log_probs` (B,R float32, 0 on padding) if given; the
        input's non-tensor fields and meta_info unchanged.
    """
    idx, attn, pos = (prompts.batch[k] for k in (keys.INPUT_IDS, keys.ATTENTION_MASK, keys.POSITION_IDS))
    caps = row_caps(prompts, response_length)
    if caps is not None:  # every engine's output honours the per-sample caps, whatever it was asked for
        response_ids = [list(r)[:c] for r, c in zip(response_ids, caps)]
        log_probs = None if log_probs is None else [list(lp)[:c] for lp, c in zip(log_probs, caps)]
    pad_id = prompts.meta_info.get(keys.META_PAD_TOKEN_ID)
    pad_id = 0 if pad_id is None else int(pad_id)
    eos_ids = eos_id_set(prompts.meta_info.get(keys.META_EOS_TOKEN_ID))
    responses = pad_2d(response_ids, response_length, pad_id, idx.dtype)
    lengths = torch.tensor([min(len(r), response_length) for r in response_ids], dtype=torch.long)
    response_mask = response_mask_from(responses, lengths, eos_ids).to(attn.dtype)
    # positions continue from the last prompt position (left padding keeps it at column -1)
    delta = torch.arange(1, response_length + 1, dtype=pos.dtype).unsqueeze(0)
    response_pos = pos[..., -1:] + delta
    tensors = {
        keys.PROMPTS: idx,
        keys.RESPONSES: responses,
        keys.INPUT_IDS: torch.cat([idx, responses], dim=-1),
        keys.ATTENTION_MASK: torch.cat([attn, response_mask], dim=-1),
        keys.POSITION_IDS: torch.cat([pos, response_pos], dim=-1),
        keys.RESPONSE_MASK: response_mask,
    }
    if log_probs is not None:
        lp = pad_2d(log_probs, response_length, 0.0, torch.float32)
        tensors[keys.ROLLOUT_LOG_PROBS] = lp * response_mask.to(torch.float32)
    non_tensors = {k: v for k, v in (prompts.non_tensor_batch or {}).items()}
    return DataProto.from_dict(tensors=tensors, non_tensors=non_tensors, meta_info=dict(prompts.meta_info))
