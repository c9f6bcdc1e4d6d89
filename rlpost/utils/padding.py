"""Remove-padding ("rmpad"): pack the real tokens of a micro-batch into one row and run without pad tokens.

Attention path: the packed row is fed to the HF model with `attention_mask=None`, `use_cache=False` and
`position_ids` that restart at 0 for every sequence. Models loaded with `use_remove_padding`
(`rlpost.utils.model.load_model`) attend causally within each sequence through
`rlpost.engine.packed_attention` (PyTorch's varlen flash kernel on CUDA, per-sequence SDPA elsewhere), with no
(N x N) mask; any other HF model falls back to transformers' own packed-sequence detection (a block-diagonal
mask for SDPA). No pad tokens are computed, which is where the saving comes from; the log-probs equal the
padded path's on every real token (tests/engine/test_packed_attention.py).
"""

from __future__ import annotations

import torch


def unpad_input(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Pack the real tokens of a padded batch into one row.

    Args:
        input_ids: (B, T) token ids, padded anywhere.
        attention_mask: (B, T) 1 on real tokens.
        position_ids: (B, T) positions; on real tokens they must start at 0 for each sequence.

    Returns:
        packed_ids: (1, N) real tokens of all rows, row after row (N = attention_mask.sum()).
        packed_pos: (1, N) their position ids.
        indices: (N,) flat indices into the (B * T) grid, for `pad_output`.
    """
    mask = attention_mask.reshape(-1).bool()
    indices = torch.nonzero(mask, as_tuple=False).squeeze(-1)
    packed_ids = input_ids.reshape(-1)[indices].unsqueeze(0)
    packed_pos = position_ids.reshape(-1)[indices].unsqueeze(0)
    return packed_ids, packed_pos, indices


def pad_output(values: torch.Tensor, indices: torch.Tensor, batch: int, seqlen: int) -> torch.Tensor:
    """Scatter packed per-token values back to the padded grid (zeros on pad positions).

    Args:
        values: (N, ...) one value (or vector) per packed token.
        indices: (N,) from `unpad_input`.
        batch: B. seqlen: T.

    Returns:
        (B, T, ...) tensor.
    """
    out = values.new_zeros((batch * seqlen, *values.shape[1:]))
    out[indices] = values
    return out.reshape(batch, seqlen, *values.shape[1:])


def next_token_labels(packed_ids: torch.Tensor) -> torch.Tensor:
    """Labels for next-token log-probs in the packed row: (1, N) -> (N,) ids shifted left by one.

    The label of each sequence's last token is the next sequence's first token; those positions are never
    read (they predict past the end of a response) because callers keep only positions P-1 .. T-2 of real
    response tokens.
    """
    return torch.roll(packed_ids, shifts=-1, dims=1).squeeze(0)
