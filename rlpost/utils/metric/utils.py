"""Reducing per-rank / per-micro-batch metric lists (verl's `utils.metric.utils`; also re-exported by
`rlpost.trainer.ppo.metric_utils`).

A plain list reduces by its key's name (max / min / mean); a `Metric` carries its own aggregation, so a count
can be summed across workers while a loss is averaged.
"""

from __future__ import annotations

from enum import Enum
from typing import Any

import numpy as np
import torch

__all__ = ["AggregationType", "Metric", "reduce_metrics"]


class AggregationType(Enum):
    """How a `Metric`'s values become one number."""

    MEAN = "mean"
    SUM = "sum"
    MIN = "min"
    MAX = "max"


_REDUCERS = {AggregationType.MEAN: np.mean, AggregationType.SUM: np.sum, AggregationType.MIN: np.min,
             AggregationType.MAX: np.max}


class Metric:
    """Numeric values collected under one aggregation (mean, sum, min or max).

    Example:
        >>> m = Metric("sum", [1, 2])
        >>> m.append(torch.tensor(3.0))
        >>> float(m.aggregate())
        6.0
    """

    def __init__(self, aggregation: str | AggregationType, value: Any = None) -> None:
        try:
            self.aggregation = AggregationType(aggregation)
        except ValueError as err:
            valid = [a.value for a in AggregationType]
            raise ValueError(f"Metric: unknown aggregation {aggregation!r}; valid: {valid}") from err
        self.values: list[float | int] = []
        if value is not None:
            self.extend(value) if isinstance(value, (list, tuple, Metric)) else self.append(value)

    def append(self, value: Any) -> None:
        """Add one number (int, float or a one-element tensor); a Metric adds all of its values."""
        if isinstance(value, Metric):
            self.extend(value)
            return
        if isinstance(value, torch.Tensor):
            if value.numel() != 1:
                raise ValueError(f"Metric.append: a tensor must hold one value, got shape {tuple(value.shape)}")
            value = value.detach().item()
        if isinstance(value, bool) or not isinstance(value, (int, float, np.number)):
            raise ValueError(f"Metric.append: {value!r} ({type(value).__name__}) is not a number")
        self.values.append(value)

    def extend(self, values: Metric | list | tuple) -> None:
        """Add several numbers, or another Metric's values (which must aggregate the same way)."""
        if isinstance(values, Metric):
            if values.aggregation != self.aggregation:
                raise ValueError(f"Metric.extend: aggregation {values.aggregation.value!r} into "
                                 f"{self.aggregation.value!r}")
            values = values.values
        for value in values:
            self.append(value)

    def aggregate(self) -> float:
        """The values reduced by the aggregation."""
        if not self.values:
            raise ValueError(f"Metric.aggregate: no values to {self.aggregation.value}")
        return _REDUCERS[self.aggregation](self.values)

    @classmethod
    def chain(cls, metric_lists: list[Metric]) -> Metric:
        """One Metric holding the values of all (the first one's aggregation; mean when the list is empty)."""
        out = cls(metric_lists[0].aggregation if metric_lists else AggregationType.MEAN)
        for metric in metric_lists:
            out.extend(metric)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any], aggregation: str | AggregationType) -> dict[str, Metric]:
        """{name: Metric(aggregation, value)} for every entry."""
        return {key: cls(aggregation, value) for key, value in data.items()}

    def init_list(self) -> Metric:
        """An empty Metric with the same aggregation."""
        return Metric(self.aggregation)

    def __repr__(self) -> str:
        return f"Metric({self.aggregation.value!r}, {self.values!r})"


def reduce_metrics(metrics: dict[str, Any]) -> dict[str, float]:
    """One number per metric from its list of values (one per rank or micro-batch), by verl's rule: the max for
    a key containing "max", the min for one containing "min", else the mean; a `Metric` by its own aggregation;
    scalars pass through."""
    def reduce(key: str, values: Any) -> Any:
        if isinstance(values, Metric):
            return float(values.aggregate())
        if not isinstance(values, (list, tuple, np.ndarray)):
            return values
        fn = np.max if "max" in key else np.min if "min" in key else np.mean
        return float(fn(values))

    return {k: reduce(k, v) for k, v in metrics.items()}
