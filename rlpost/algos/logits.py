"""Per-token entropy and log-probs from logits, with bounded memory.

Shapes: B = rows, T = tokens, V = vocabulary. Work is done in float32 on chunks of rows so that
the (rows, V) float32 temporaries never exceed `chunk_size x V`, whatever the input dtype.
"""

from __future__ import annotations

import torch


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(logits) over the last dim: logsumexp(z) - sum(p * z).

    Args:
        logits: (..., V), e.g. (B, T, V).

    Returns:
        (...), e.g. (B, T), in the dtype of `logits`.
    """
    z = logits.float()
    probs = torch.softmax(z, dim=-1)
    return (torch.logsumexp(z, dim=-1) - (probs * z).sum(dim=-1)).to(logits.dtype)


def entropy_from_logits_with_chunking(logits: torch.Tensor, chunk_size: int = 2048) -> torch.Tensor:
    """Same value as `entropy_from_logits`, computed `chunk_size` rows (tokens) at a time.

    Args:
        logits: (..., V). chunk_size: rows of the flattened (N, V) view handled per step.

    Returns:
        (...) entropy.
    """
    flat = logits.reshape(-1, logits.shape[-1])
    parts = [entropy_from_logits(flat[i : i + chunk_size]) for i in range(0, flat.shape[0], chunk_size)]
    out = torch.cat(parts) if parts else flat.new_zeros(0)
    return out.reshape(logits.shape[:-1])


def logprobs_from_logits(logits: torch.Tensor, labels: torch.Tensor, chunk_size: int = 2048) -> torch.Tensor:
    """log softmax(logits)[label] as z[label] - logsumexp(z), without materialising log_softmax.

    Args:
        logits: (..., V), e.g. (B, T, V). labels: (...) token ids, e.g. (B, T).
        chunk_size: rows of the flattened view handled per step.

    Returns:
        (...) log-probs in float32.
    """
    if logits.shape[:-1] != labels.shape:
        raise ValueError(f"logits {tuple(logits.shape)} and labels {tuple(labels.shape)} disagree")
    flat = logits.reshape(-1, logits.shape[-1])
    flat_labels = labels.reshape(-1, 1).long()
    parts = []
    for i in range(0, flat.shape[0], chunk_size):
        z = flat[i : i + chunk_size].float()
        picked = z.gather(-1, flat_labels[i : i + chunk_size]).squeeze(-1)
        parts.append(picked - torch.logsumexp(z, dim=-1))
    out = torch.cat(parts) if parts else flat.new_zeros(0, dtype=torch.float32)
    return out.reshape(labels.shape)
