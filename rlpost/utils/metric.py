"""Reducing per-rank / per-micro-batch metric lists (verl's `utils.metric`; also re-exported by
`rlpost.trainer.ppo.metric_utils`)."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["reduce_metrics"]


def reduce_metrics(metrics: dict[str, Any]) -> dict[str, float]:
    """One number per metric from its list of values (one per rank or micro-batch), by verl's rule: the max for
    a key containing "max", the min for one containing "min", else the mean; scalars pass through."""
    def reduce(key: str, values: Any) -> float:
        fn = np.max if "max" in key else np.min if "min" in key else np.mean
        return float(fn(values))

    return {k: reduce(k, v) if isinstance(v, (list, tuple, np.ndarray)) else v for k, v in metrics.items()}
