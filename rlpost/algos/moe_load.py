"""MoE expert-load metrics (`actor_rollout_ref.rollout.moe_load_balance_metrics_interval`).

The counts come from the actor's old-log-prob pass, the forward of the policy that generated the batch: for each
MoE layer and expert, how many of the response tokens' top-k slots chose that expert. With E experts, layer l's
share of expert e is p = count / sum(counts of l), and its deviation from a uniform load is d = p * E - 1 (0 when
every expert gets its 1 / E; E - 1 when one expert takes all). Per layer: `max_vio` = max_e d, `min_vio` =
min_e d, `avg_vio` = mean_e |d|; then the max and the mean of each over the layers.

Pure: tensors in, numbers out; no worker, engine or Ray.
"""

from __future__ import annotations

import torch

PREFIX = "actor/moe"


def row_expert_counts(routed: torch.Tensor, token_mask: torch.Tensor, num_experts: int) -> torch.Tensor:
    """Per row, layer and expert, the top-k slots of the masked tokens that chose the expert.

    Args:
        routed: (B, T, L, K) expert indices of each position (any integer dtype).
        token_mask: (B, T), true where a counted token sits.
        num_experts: E; every index must lie in [0, E).

    Returns:
        (B, L, E) int64 counts; row b of layer l sums to K x (counted tokens of row b).
    """
    if routed.dim() != 4 or token_mask.shape != routed.shape[:2]:
        raise ValueError(f"row_expert_counts: routed {tuple(routed.shape)} (B, T, L, K) and mask "
                         f"{tuple(token_mask.shape)} (B, T) do not fit")
    b, _, layers, _ = routed.shape
    idx = routed.long()
    if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= num_experts):
        raise ValueError(f"row_expert_counts: expert ids outside [0, {num_experts})")
    # one bin per (row, layer, expert); only the counted tokens' slots are gathered, on the input's device
    mask = token_mask.to(device=idx.device, dtype=torch.bool)
    row = torch.arange(b, device=idx.device)[:, None].expand_as(mask)[mask]  # (n,) the row of each counted token
    layer = torch.arange(layers, device=idx.device)[None, :, None]
    bins = (row[:, None, None] * layers + layer) * num_experts + idx[mask]  # (n, L, K)
    counts = torch.bincount(bins.reshape(-1), minlength=b * layers * num_experts)
    return counts.reshape(b, layers, num_experts)


def load_balance_metrics(counts: torch.Tensor, prefix: str = PREFIX) -> dict[str, float]:
    """The deviation metrics of (L, E) counts (see the module's docstring); {} when nothing was counted."""
    if counts.dim() != 2 or counts.numel() == 0 or int(counts.sum()) == 0:
        return {}
    load = counts.double()
    experts = load.shape[1]
    dev = load / load.sum(dim=1, keepdim=True).clamp_min(1.0) * experts - 1.0
    per = {"max_vio": dev.max(dim=1).values, "min_vio": dev.min(dim=1).values, "avg_vio": dev.abs().mean(dim=1)}
    out: dict[str, float] = {}
    for name, values in per.items():
        for layer, v in enumerate(values.tolist()):
            out[f"{prefix}/{name}/layer_{layer}"] = v
        out[f"{prefix}/{name}/max"] = float(values.max())
        out[f"{prefix}/{name}/avg"] = float(values.mean())
    return out


def due(interval: int, step: int) -> bool:
    """Whether step `step` (1-based) logs the metrics: every `interval` steps, never when it is 0."""
    return interval > 0 and step % interval == 0
