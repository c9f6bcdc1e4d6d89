"""Reductions over the valid (mask == 1) entries of a tensor.

`mask` has the shape of `values` (or broadcasts to it) and holds 0/1 (bool, int or float). Entries
where the mask is 0 never influence the result, even when they hold inf or nan.
"""

from __future__ import annotations

import torch

_EPS = 1e-8


def masked_sum(values: torch.Tensor, mask: torch.Tensor, axis: int | None = None) -> torch.Tensor:
    """Sum of `values` where `mask` is set.

    Args:
        values: (...) any shape.
        mask: same shape as `values`.
        axis: dimension to reduce; None reduces everything to a scalar.
    """
    kept = torch.where(mask.bool(), values * mask, torch.zeros_like(values))
    return kept.sum() if axis is None else kept.sum(dim=axis)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, axis: int | None = None) -> torch.Tensor:
    """Mean of `values` where `mask` is set; 0 where nothing is set (no nan)."""
    count = mask.sum() if axis is None else mask.sum(dim=axis)
    return masked_sum(values, mask, axis) / count.clamp_min(_EPS)


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance (scalar) of `values` where `mask` is set.

    `unbiased` applies Bessel's correction n / (n - 1) like `torch.var`; with a single valid entry
    the biased value (0) is returned instead of dividing by zero.
    """
    mean = masked_mean(values, mask)
    variance = masked_mean((values - mean) ** 2, mask)
    count = mask.sum()
    if unbiased and count > 1:
        variance = variance * count / (count - 1)
    return variance


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """(values - mean) / sqrt(var + 1e-8) with mean/var over the valid entries (var unbiased).

    Args:
        values: (...) any shape.
        mask: same shape as `values`.
        shift_mean: if False the mean is added back (only the scale is normalised).

    Returns:
        Tensor of the shape of `values`; entries where mask is 0 are transformed too (callers mask).
    """
    mean = masked_mean(values, mask)
    var = masked_var(values, mask)
    whitened = (values - mean) * torch.rsqrt(var + _EPS)
    return whitened if shift_mean else whitened + mean
