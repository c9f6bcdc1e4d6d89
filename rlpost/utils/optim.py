"""AdamW and the learning-rate schedules (constant / cosine, both with linear warmup).

Config keys read (verl's `*.optim` group): lr, weight_decay, betas, lr_warmup_steps, lr_warmup_steps_ratio,
warmup_style (or lr_scheduler), min_lr_ratio, num_cycles, total_training_steps.
"""

from __future__ import annotations

import math
from typing import Any, Iterable

import torch
from torch.optim.lr_scheduler import LambdaLR

SCHEDULES = ("constant", "cosine")


def _get(cfg: Any, key: str, default: Any) -> Any:
    """Read `key` from a DictConfig / dict / object, `default` when missing or None."""
    if cfg is None:
        return default
    val = cfg.get(key, default) if hasattr(cfg, "get") else getattr(cfg, key, default)
    return default if val is None else val


def build_optimizer(params: Iterable[torch.nn.Parameter], optim_cfg: Any) -> torch.optim.AdamW:
    """AdamW from `optim.lr`, `optim.weight_decay` (default 0.01) and `optim.betas` (default (0.9, 0.999))."""
    betas = tuple(_get(optim_cfg, "betas", (0.9, 0.999)))
    if len(betas) != 2:
        raise ValueError(f"optim.betas must have 2 values, got {betas}")
    return torch.optim.AdamW(
        params,
        lr=float(_get(optim_cfg, "lr", 1e-6)),
        betas=(float(betas[0]), float(betas[1])),
        weight_decay=float(_get(optim_cfg, "weight_decay", 0.01)),
    )


def num_warmup_steps(optim_cfg: Any, total_steps: int) -> int:
    """`lr_warmup_steps` when >= 0, else `int(lr_warmup_steps_ratio * total_steps)` (verl's rule)."""
    steps = int(_get(optim_cfg, "lr_warmup_steps", -1))
    if steps < 0:
        steps = int(float(_get(optim_cfg, "lr_warmup_steps_ratio", 0.0)) * total_steps)
    return steps


def constant_lr_lambda(step: int, warmup: int) -> float:
    """LR multiplier: linear warmup over `warmup` steps, then 1."""
    if step < warmup:
        return float(step) / float(max(1, warmup))
    return 1.0


def cosine_lr_lambda(step: int, warmup: int, total: int, min_lr_ratio: float, num_cycles: float) -> float:
    """LR multiplier: linear warmup, then cosine from 1 down to `min_lr_ratio` (num_cycles=0.5: half a wave)."""
    if step < warmup:
        return float(step) / float(max(1, warmup))
    progress = float(step - warmup) / float(max(1, total - warmup))
    wave = 0.5 * (1.0 + math.cos(math.pi * float(num_cycles) * 2.0 * progress))
    return max(0.0, wave * (1.0 - min_lr_ratio) + min_lr_ratio)


def build_lr_scheduler(optimizer: torch.optim.Optimizer, optim_cfg: Any) -> LambdaLR:
    """LambdaLR for `warmup_style` / `lr_scheduler` in {constant, cosine}.

    `total_training_steps` is injected by the trainer before the worker builds its model; cosine needs it.
    """
    style = _get(optim_cfg, "lr_scheduler", None) or _get(optim_cfg, "warmup_style", "constant")
    if style not in SCHEDULES:
        raise ValueError(f"optim.warmup_style={style!r} is not one of {SCHEDULES}; nearest valid: 'constant'")
    total = int(_get(optim_cfg, "total_training_steps", 0))
    if style == "cosine" and total <= 0:
        raise ValueError("optim.total_training_steps must be > 0 for the cosine schedule (the trainer sets it)")
    warmup = num_warmup_steps(optim_cfg, max(total, 0))
    if style == "constant":
        return LambdaLR(optimizer, lambda s: constant_lr_lambda(s, warmup))
    min_ratio = float(_get(optim_cfg, "min_lr_ratio", 0.0))
    cycles = float(_get(optim_cfg, "num_cycles", 0.5))
    if not 0.0 <= min_ratio <= 1.0:
        raise ValueError(f"optim.min_lr_ratio={min_ratio} must be in [0, 1]; nearest valid: {min(max(min_ratio, 0), 1)}")
    return LambdaLR(optimizer, lambda s: cosine_lr_lambda(s, warmup, total, min_ratio, cycles))
