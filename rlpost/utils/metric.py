"""Reducing per-rank / per-micro-batch metric lists (verl's `utils.metric`; also re-exported by
`rlpost.trainer.ppo.metric_utils`)."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["reduce_metrics"]


def reduce_metrics(metrics: dict[str, Any]) -> dict[str, float]:
    """Mean of each metric's list of values (one per rank or micro-batch); scalars pass through."""
    return {k: float(np.mean(v)) if isinstance(v, (list, tuple, np.ndarray)) else v for k, v in metrics.items()}
