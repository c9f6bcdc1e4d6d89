"""`rlpost.utils.metric`: Metric values with their own aggregation, and reduce_metrics over them."""

import pytest
import torch

from rlpost.utils.metric import AggregationType, Metric, reduce_metrics
from rlpost.utils.metric.utils import Metric as MetricFromUtils


def test_metric_aggregations_by_hand():
    values = [3, 1.5, torch.tensor(4.5)]
    assert Metric("mean", values).aggregate() == pytest.approx(3.0)
    assert Metric("sum", values).aggregate() == pytest.approx(9.0)
    assert Metric(AggregationType.MIN, values).aggregate() == 1.5
    assert Metric("max", values).aggregate() == 4.5
    assert MetricFromUtils is Metric


def test_metric_append_extend_chain_from_dict():
    m = Metric("sum", 1.0)
    m.append(Metric("sum", [2.0, 3.0]))
    assert m.values == [1.0, 2.0, 3.0] and m.init_list().values == [] and m.init_list().aggregation.value == "sum"
    with pytest.raises(ValueError, match="aggregation 'mean' into 'sum'"):
        m.extend(Metric("mean", [1.0]))
    with pytest.raises(ValueError, match="one value"):
        m.append(torch.ones(2))
    with pytest.raises(ValueError, match="not a number"):
        m.append("x")
    with pytest.raises(ValueError, match="unknown aggregation 'median'"):
        Metric("median")
    chained = Metric.chain([Metric("max", [1, 5]), Metric("max", [7])])
    assert chained.aggregate() == 7 and Metric.chain([]).aggregation is AggregationType.MEAN
    made = Metric.from_dict({"a": 1.0, "b": [2.0, 4.0]}, "mean")
    assert made["b"].aggregate() == 3.0 and made["a"].values == [1.0]


def test_reduce_metrics_uses_each_metrics_own_aggregation():
    out = reduce_metrics({"tokens": Metric("sum", [10, 20]), "loss_max": [1.0, 3.0], "loss": [1.0, 3.0], "n": 4})
    assert out == {"tokens": 30.0, "loss_max": 3.0, "loss": 2.0, "n": 4}
