"""DAPO dynamic sampling (`algorithm.filter_groups`): keep only prompt groups whose responses disagree.

A group whose n responses all got the same metric (all right or all wrong) has zero group-relative
advantage and so no gradient; DAPO drops such groups and samples more prompts to fill the batch.
Shapes: B = batch rows (prompts x n responses), R = response length.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

# Metric names computed from the batch tensors; any other name is read from the reward's extra info.
_TENSOR_METRICS = ("score", "seq_reward", "seq_final_reward")


def kept_group_rows(uids: np.ndarray, metric_values: np.ndarray) -> np.ndarray:
    """Indices of the rows whose group (rows sharing a uid) has a non-constant metric (std > 0).

    Groups of one row are kept (as verl). "Constant" is tested exactly (max == min), so float
    round-off in a std never keeps a group whose values are all equal.

    Args:
        uids: (B,) group id per row. metric_values: (B,) the metric per row.

    Returns:
        (K,) int64 row indices in increasing order.
    """
    uids, values = np.asarray(uids), np.asarray(metric_values, dtype=np.float64)
    if uids.shape != values.shape or uids.ndim != 1:
        raise ValueError(f"uids {uids.shape} and metric_values {values.shape} must both be (B,)")
    if uids.size == 0:
        return np.zeros(0, dtype=np.int64)
    _, gid = np.unique(uids, return_inverse=True)
    gid = gid.reshape(-1)
    n_groups = int(gid.max()) + 1
    hi = np.full(n_groups, -np.inf)
    lo = np.full(n_groups, np.inf)
    np.maximum.at(hi, gid, values)
    np.minimum.at(lo, gid, values)
    size = np.bincount(gid, minlength=n_groups)
    keep_group = (hi > lo) | (size == 1)
    return np.nonzero(keep_group[gid])[0].astype(np.int64)


def group_metric(
    name: str,
    token_level_scores: torch.Tensor,
    token_level_rewards: torch.Tensor,
    reward_extra_info: dict[str, Any],
) -> np.ndarray:
    """Per-row value of the `algorithm.filter_groups.metric` named `name` (verl's names).

    score / seq_reward: row sum of token_level_scores. seq_final_reward: row sum of
    token_level_rewards (after an in-reward KL penalty). Any other name, e.g. acc: the reward
    function's extra info of that name (one value per row).

    Args:
        name: the metric name. token_level_scores: (B, R). token_level_rewards: (B, R).
        reward_extra_info: name -> (B,) values returned by the reward function.

    Returns:
        (B,) float64 array.

    Raises:
        ValueError: unknown name (the message lists the valid ones) or a value list of the wrong length.
    """
    if name in ("score", "seq_reward"):
        return token_level_scores.detach().sum(dim=-1).double().cpu().numpy()
    if name == "seq_final_reward":
        return token_level_rewards.detach().sum(dim=-1).double().cpu().numpy()
    if name in reward_extra_info:
        values = np.asarray(reward_extra_info[name], dtype=np.float64).reshape(-1)
        rows = token_level_scores.shape[0]
        if values.shape[0] != rows:
            raise ValueError(f"reward extra info {name!r} has {values.shape[0]} values for {rows} rows")
        return values
    valid = sorted(set(_TENSOR_METRICS) | set(reward_extra_info))
    raise ValueError(f"algorithm.filter_groups.metric={name!r} is invalid: must be one of {valid} "
                     "(acc and other names come from the reward function's extra info)")
