"""Per-token policy versions of a generated batch and the staleness metrics of a step (pure tensor code).

A policy version is the number of actor updates behind the weights that sampled a token; a token's staleness
is the trained policy's version minus its own.
"""

from __future__ import annotations

import torch

PREFIX = "fully_async"


def token_versions(response_mask: torch.Tensor, version: int) -> torch.Tensor:
    """(B, R) int64: `version` on response tokens (mask 1), -1 on padding: a batch generated whole by one set
    of weights (a partial rollout records its tokens' versions itself, `rlpost.rollout.partial`)."""
    return torch.where(response_mask.bool(), torch.tensor(version, dtype=torch.int64), torch.tensor(-1))


def staleness_metrics(versions: torch.Tensor, trained_version: int) -> dict[str, float]:
    """Metrics of one step's batch.

    Args:
        versions: (B, R) int64 per-token policy versions, -1 on padding.
        trained_version: the version of the policy the batch trains (actor updates so far).

    Returns:
        `fully_async/staleness_hist/<s>`: rows (samples) whose oldest token lags by s versions, for each s seen;
        `fully_async/max_staleness`; `fully_async/stale_tokens` (response tokens sampled by older weights) and
        `fully_async/stale_token_fraction`.
    """
    real = versions >= 0
    lag = torch.where(real, trained_version - versions, torch.zeros_like(versions))
    row_lag = lag.max(dim=-1).values  # (B,): a row's staleness is its oldest token's
    values, counts = torch.unique(row_lag, return_counts=True)
    out = {f"{PREFIX}/staleness_hist/{int(v)}": float(c) for v, c in zip(values.tolist(), counts.tolist())}
    stale = int(((lag > 0) & real).sum())
    out[f"{PREFIX}/max_staleness"] = float(row_lag.max()) if row_lag.numel() else 0.0
    out[f"{PREFIX}/stale_tokens"] = float(stale)
    out[f"{PREFIX}/stale_token_fraction"] = stale / max(int(real.sum()), 1)
    return out


def partial_metrics(versions: torch.Tensor | None) -> dict[str, float]:
    """Partial-rollout counts of a generated batch (zeros for None).

    Args:
        versions: (B, R) int64 per-token policy versions, -1 on padding.

    Returns:
        `fully_async/partial_samples`: rows whose tokens come from more than one version;
        `fully_async/resumed_tokens`: tokens sampled by newer weights than the row's first token (after a pause
        at a weight push); `fully_async/aborted_tokens`: at each pause where the version changes, the tokens
        the row already held (fed back as the resumed request's prompt, their KV cache recomputed).
    """
    names = ("partial_samples", "resumed_tokens", "aborted_tokens")
    if versions is None or versions.numel() == 0:
        return {f"{PREFIX}/{n}": 0.0 for n in names}
    real = versions >= 0
    first = versions[:, :1].expand_as(versions)
    resumed = real & (versions != first)
    change = real[:, 1:] & (versions[:, 1:] != versions[:, :-1])  # token j+1 starts a new version
    held = torch.arange(1, versions.shape[1], dtype=torch.int64).expand_as(change)  # tokens before it
    values = (float(resumed.any(dim=-1).sum()), float(resumed.sum()), float((held * change).sum()))
    return {f"{PREFIX}/{n}": v for n, v in zip(names, values)}
