"""verl's tensor helpers under verl's module path: `import rlpost.utils.torch_functional as verl_F`.

The reductions and log-prob/entropy kernels live in `rlpost.utils.masked` and `rlpost.algos.logits`;
this module re-exports them with verl's signatures and adds the small padding / masking helpers that
custom datasets, losses and recipes call (`get_response_mask`, `pad_sequence_to_length`,
`postprocess_data`, ...).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
import torch.nn.functional as F

from rlpost.utils.masked import masked_mean, masked_sum, masked_var, masked_whiten

__all__ = [
    "calculate_sum_pi_squared_from_logits", "distributed_masked_mean", "distributed_mean_max_min_std",
    "expand_as_nested", "clip_by_value", "entropy_from_logits", "entropy_from_logits_with_chunking", "get_eos_mask",
    "get_response_mask", "logprobs_from_logits", "masked_mean", "masked_sum", "masked_var", "masked_whiten",
    "pad_2d_list_to_length", "pad_sequence_to_length", "postprocess_data", "tokenize_and_postprocess_data",
]

TRUNCATIONS = ("left", "right", "middle", "error")


def _kernels():
    """rlpost's log-prob/entropy kernels (they live with the algorithms; imported when used)."""
    from rlpost.algos import logits as kernels

    return kernels


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(logits) over the last dim. logits: (..., V) -> (...)."""
    return _kernels().entropy_from_logits(logits)


def entropy_from_logits_with_chunking(logits: torch.Tensor, chunk_size: int = 2048) -> torch.Tensor:
    """`entropy_from_logits` computed `chunk_size` tokens at a time (bounded float32 temporaries)."""
    return _kernels().entropy_from_logits_with_chunking(logits, chunk_size)


def logprobs_from_logits(logits: torch.Tensor, labels: torch.Tensor, inplace_backward: bool = True) -> torch.Tensor:
    """log softmax(logits)[labels] in float32. logits: (..., V); labels: (...) -> (...).

    `inplace_backward` selects a flash-attn kernel option in verl; the result and its gradient are the
    same either way, so it is accepted and has no effect here.
    """
    del inplace_backward
    return _kernels().logprobs_from_logits(logits, labels)


def clip_by_value(x: torch.Tensor, tensor_min: torch.Tensor | float, tensor_max: torch.Tensor | float) -> torch.Tensor:
    """Element-wise clamp of `x` into [tensor_min, tensor_max] (bounds may be tensors)."""
    return torch.max(torch.min(torch.as_tensor(x), torch.as_tensor(tensor_max)), torch.as_tensor(tensor_min))


def get_response_mask(response_id: torch.Tensor, eos_token: int | Sequence[int] = 2,
                      dtype: torch.dtype = torch.int64) -> torch.Tensor:
    """1 on every token up to and including the first end-of-sequence token of each row, 0 after it.

    Args:
        response_id: (B, R) token ids.
        eos_token: one id or several (any of them ends the response).
        dtype: of the returned mask.

    Returns:
        (B, R) mask; a row without an end token is all ones.
    """
    eos_ids = torch.as_tensor(eos_token if isinstance(eos_token, (list, tuple)) else [eos_token],
                              device=response_id.device)
    is_eos = torch.isin(response_id, eos_ids).to(torch.int64)
    eos_before = is_eos.cumsum(dim=-1) - is_eos  # end tokens strictly before each position
    return (eos_before == 0).to(dtype)


get_eos_mask = get_response_mask  # verl's older name


def pad_sequence_to_length(tensors: torch.Tensor, max_seq_len: int, pad_token_id: int | float,
                           left_pad: bool = False) -> torch.Tensor:
    """Pad the last dim of `tensors` to `max_seq_len` with `pad_token_id` (on the left if `left_pad`);
    a tensor already that long or longer is returned as it is."""
    missing = max_seq_len - tensors.shape[-1]
    if missing <= 0:
        return tensors
    return F.pad(tensors, (missing, 0) if left_pad else (0, missing), "constant", pad_token_id)


def pad_2d_list_to_length(response: Sequence[Sequence[int]], pad_token_id: int,
                          max_length: int | None = None) -> torch.Tensor:
    """(B, L) tensor of ragged rows right-padded with `pad_token_id`; L is the longest row, or
    `max_length` when that is longer."""
    longest = max((len(row) for row in response), default=0)
    width = max(longest, max_length or 0)
    return torch.tensor([list(row) + [pad_token_id] * (width - len(row)) for row in response])


def _truncate(tensors: torch.Tensor, max_length: int, truncation: str) -> torch.Tensor:
    length = tensors.shape[-1]
    if truncation == "left":
        return tensors[..., length - max_length:]
    if truncation == "right":
        return tensors[..., :max_length]
    if truncation == "middle":
        head = max_length // 2
        return torch.cat([tensors[..., :head], tensors[..., length - (max_length - head):]], dim=-1)
    raise ValueError(f"sequence of {length} tokens is longer than max_length={max_length} "
                     f"(truncation={truncation!r}); choose truncation left, right or middle, or raise max_length")


def postprocess_data(input_ids: torch.Tensor, attention_mask: torch.Tensor, max_length: int, pad_token_id: int,
                     left_pad: bool = True, truncation: str = "error") -> tuple[torch.Tensor, torch.Tensor]:
    """Bring (1, L) tokenizer outputs to exactly `max_length`: pad (left by default; the mask with 0) or cut.

    Args:
        input_ids, attention_mask: (1, L) (any leading dims are kept).
        truncation: `left` keeps the tail, `right` the head, `middle` both ends; `error` raises.

    Returns:
        (input_ids, attention_mask), each (..., max_length).
    """
    if truncation not in TRUNCATIONS:
        raise ValueError(f"truncation={truncation!r} is not one of {', '.join(TRUNCATIONS)}")
    if input_ids.shape[-1] < max_length:
        return (pad_sequence_to_length(input_ids, max_length, pad_token_id, left_pad),
                pad_sequence_to_length(attention_mask, max_length, 0, left_pad))
    if input_ids.shape[-1] > max_length:
        return _truncate(input_ids, max_length, truncation), _truncate(attention_mask, max_length, truncation)
    return input_ids, attention_mask


def tokenize_and_postprocess_data(prompt: str, tokenizer: Any, max_length: int, pad_token_id: int,
                                  left_pad: bool = True, truncation: str = "error",
                                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokenize `prompt` without special tokens and `postprocess_data` it to (1, max_length)."""
    encoded = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)
    return postprocess_data(encoded["input_ids"], encoded["attention_mask"], max_length, pad_token_id, left_pad,
                            truncation)


def calculate_sum_pi_squared_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """sum_v p(v)^2 of softmax(logits) over the last dim, as exp(logsumexp(2x) - 2 logsumexp(x)) (no softmax
    materialised, stable for large logits). (..., V) -> (...)."""
    return torch.exp(torch.logsumexp(2.0 * logits, dim=-1) - 2.0 * torch.logsumexp(logits, dim=-1))


def _all_reduce(t: torch.Tensor, op: str, group: Any = None) -> torch.Tensor:
    """All-reduce in place over `group` when torch.distributed is up; the local value otherwise."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(t, op=getattr(dist.ReduceOp, op), group=group)
    return t


_Stats = tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]


def distributed_mean_max_min_std(local_tensor: torch.Tensor, compute_max: bool = True, compute_min: bool = True,
                                 compute_std: bool = True, group: Any = None) -> _Stats:
    """(mean, max, min, std) of all elements on every rank of `group` (None for a statistic turned off).

    std is the sample standard deviation (n - 1) about the global mean. Outside torch.distributed the
    statistics are this process's own.
    """
    total = _all_reduce(local_tensor.sum().double(), "SUM", group)
    count = _all_reduce(torch.tensor(float(local_tensor.numel()), dtype=torch.float64), "SUM", group)
    mean = (total / count).to(local_tensor.dtype)
    high = _all_reduce(local_tensor.max().clone(), "MAX", group) if compute_max else None
    low = _all_reduce(local_tensor.min().clone(), "MIN", group) if compute_min else None
    std = None
    if compute_std:
        squares = _all_reduce((local_tensor.double() - mean.double()).pow(2).sum(), "SUM", group)
        std = torch.sqrt(squares / (count - 1)).to(local_tensor.dtype)
    return mean, high, low, std


def distributed_masked_mean(local_tensor: torch.Tensor, local_mask: torch.Tensor, group: Any = None) -> torch.Tensor:
    """Mean of the elements where `local_mask` is 1, over every rank of `group` (this process's alone outside
    torch.distributed)."""
    mask = local_mask.to(local_tensor.dtype)
    total = _all_reduce((local_tensor * mask).sum(), "SUM", group)
    count = _all_reduce(mask.sum(), "SUM", group)
    return total / count


def expand_as_nested(tensor: torch.Tensor, nested_tensor: torch.Tensor) -> torch.Tensor:
    """A jagged nested tensor shaped like `nested_tensor` (B, j) whose row i repeats tensor[i] (B,)."""
    if not nested_tensor.is_nested or nested_tensor.dim() != 2:
        raise ValueError("expand_as_nested: nested_tensor must be a 2-D nested (jagged) tensor")
    if tensor.dim() != 1 or tensor.shape[0] != nested_tensor.shape[0]:
        raise ValueError(f"expand_as_nested: tensor must be ({nested_tensor.shape[0]},), got {tuple(tensor.shape)}")
    offsets = nested_tensor.offsets()
    values = torch.repeat_interleave(tensor, offsets.diff(), dim=0)
    return torch.nested.nested_tensor_from_jagged(values=values, offsets=offsets)
