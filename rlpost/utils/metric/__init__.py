"""Metric reduction (verl's `utils.metric`): `reduce_metrics`, and `Metric` values that say how they reduce."""

from rlpost.utils.metric.utils import AggregationType, Metric, reduce_metrics

__all__ = ["AggregationType", "Metric", "reduce_metrics"]
