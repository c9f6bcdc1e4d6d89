"""The optimiser (AdamW unless `optim.optimizer` / `optim.optimizer_impl` name another) and the learning-rate
schedules (constant / cosine, both with linear warmup).

Config keys read (verl's `*.optim` group): optimizer, optimizer_impl, override_optimizer_config, lr,
weight_decay, betas, lr_warmup_steps, lr_warmup_steps_ratio,
lr_scheduler, min_lr_ratio, num_cycles, zero_indexed_step, total_training_steps. The number of training steps is
an explicit argument (the trainer knows it); `optim.total_training_steps` is only its fallback when > 0.
"""

from __future__ import annotations

import math
from typing import Any, Iterable

import torch
from torch.optim.lr_scheduler import LambdaLR

SCHEDULES = ("constant", "cosine")


def optimizer_class(optimizer_impl: str, optimizer: str, prefix: str = "optim") -> type[torch.optim.Optimizer]:
    """The class `optimizer` inside the module `optimizer_impl` (verl's rule: e.g. torch.optim + AdamW,
    torchao.optim + _AdamW, bitsandbytes.optim + AdamW8bit), checked to be a torch optimiser.

    Raises:
        ValueError: the module does not import, has no such class, or the class is not a torch.optim.Optimizer;
            the message names `<prefix>.optimizer_impl` / `<prefix>.optimizer` and a value that works.
    """
    import importlib

    try:
        module = importlib.import_module(str(optimizer_impl))
    except ImportError as err:
        raise ValueError(f"{prefix}.optimizer_impl={optimizer_impl}: the module does not import ({err}); install its "
                         f"package or use {prefix}.optimizer_impl=torch.optim") from None
    cls = getattr(module, str(optimizer), None)
    if cls is None:
        names = sorted(n for n, v in vars(module).items() if isinstance(v, type)
                       and issubclass(v, torch.optim.Optimizer) and v is not torch.optim.Optimizer)
        raise ValueError(f"{prefix}.optimizer={optimizer}: {optimizer_impl} has no such class; its optimisers: "
                         f"{', '.join(names) or 'none'} (e.g. {prefix}.optimizer=AdamW with torch.optim)")
    if not (isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer)):
        raise ValueError(f"{prefix}.optimizer={optimizer}: {optimizer_impl}.{optimizer} is not a torch.optim.Optimizer "
                         f"subclass (e.g. {prefix}.optimizer=AdamW with {prefix}.optimizer_impl=torch.optim)")
    return cls


def optimizer_kwargs(optim_cfg: Any, prefix: str = "optim") -> dict[str, Any]:
    """Constructor arguments (verl's rule): lr and weight_decay; betas for an Adam-family class (its name holds
    'adam' or 'ademamix'); then `override_optimizer_config` on top. Checked against the class's signature.

    Raises:
        ValueError: betas not two values, or an argument the class does not take (named with its key).
    """
    import inspect

    name = str(getattr(optim_cfg, "optimizer", "AdamW"))
    cls = optimizer_class(getattr(optim_cfg, "optimizer_impl", "torch.optim"), name, prefix)
    kwargs: dict[str, Any] = {"lr": float(optim_cfg.lr), "weight_decay": float(optim_cfg.weight_decay)}
    if "adam" in name.lower() or "ademamix" in name.lower():
        betas = tuple(optim_cfg.betas)
        if len(betas) != 2:
            raise ValueError(f"{prefix}.betas must have 2 values, got {list(betas)}; e.g. [0.9, 0.999]")
        kwargs["betas"] = (float(betas[0]), float(betas[1]))
    override = getattr(optim_cfg, "override_optimizer_config", None) or {}
    if not hasattr(override, "items"):
        raise ValueError(f"{prefix}.override_optimizer_config={override!r}: give a mapping of constructor arguments "
                         "(e.g. {amsgrad: true}) or null")
    kwargs.update({str(k): v for k, v in override.items()})
    params = inspect.signature(cls.__init__).parameters
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        taken = [n for n in params if n not in ("self", "params")]
        for key in kwargs:
            if key not in taken:
                where = f"{prefix}.override_optimizer_config.{key}" if key in override else f"{prefix}.{key}"
                raise ValueError(f"{where}: {cls.__module__}.{cls.__name__} takes no argument {key!r}; it takes "
                                 f"{', '.join(taken)}")
    return kwargs


def build_optimizer(params: Iterable[torch.nn.Parameter], optim_cfg: Any, prefix: str = "optim"
                    ) -> torch.optim.Optimizer:
    """`optim.optimizer` from `optim.optimizer_impl` (AdamW from torch.optim by default) with
    `optimizer_kwargs`."""
    cls = optimizer_class(getattr(optim_cfg, "optimizer_impl", "torch.optim"),
                          getattr(optim_cfg, "optimizer", "AdamW"), prefix)
    return cls(params, **optimizer_kwargs(optim_cfg, prefix))


def resolve_total_steps(optim_cfg: Any, total_training_steps: int | None) -> int:
    """Optimiser steps the schedule spans: `total_training_steps` when given, else `optim.total_training_steps`
    when > 0, else 0 (unknown: fine for a constant schedule, refused by cosine)."""
    if total_training_steps is not None:
        return int(total_training_steps)
    return max(int(optim_cfg.total_training_steps), 0)


def num_warmup_steps(lr_warmup_steps: int, lr_warmup_steps_ratio: float, total_steps: int) -> int:
    """`lr_warmup_steps` when >= 0, else `int(lr_warmup_steps_ratio * total_steps)` (verl's rule)."""
    if lr_warmup_steps >= 0:
        return int(lr_warmup_steps)
    return int(float(lr_warmup_steps_ratio) * total_steps)


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


def lr_schedule(optimizer: torch.optim.Optimizer, style: str, warmup: int, total: int, min_lr_ratio: float,
                num_cycles: float, first_step: int = 0) -> LambdaLR:
    """LambdaLR for `style` in SCHEDULES from plain values (`total` > 0 for cosine); the cosine schedule's first
    update is its step `first_step` (0, or 1 for `optim.zero_indexed_step=false`; verl shifts only that one)."""
    if style == "constant":
        return LambdaLR(optimizer, lambda s: constant_lr_lambda(s, warmup))
    if style != "cosine":
        raise ValueError(f"optim.lr_scheduler={style!r} is not one of {SCHEDULES}; nearest valid: 'constant'")
    if total <= 0:
        raise ValueError("the cosine schedule needs the number of training steps: pass total_training_steps to "
                         "the worker's init_model, or set optim.total_training_steps > 0")
    return LambdaLR(optimizer, lambda s: cosine_lr_lambda(s + first_step, warmup, total, min_lr_ratio, num_cycles))


def build_lr_scheduler(optimizer: torch.optim.Optimizer, optim_cfg: Any, total_training_steps: int | None
                       ) -> LambdaLR:
    """The `optim.lr_scheduler` schedule over `resolve_total_steps(optim_cfg, total_training_steps)` steps.

    `min_lr_ratio: null` is a floor of 0 (as documented in the YAML).
    """
    total = resolve_total_steps(optim_cfg, total_training_steps)
    warmup = num_warmup_steps(optim_cfg.lr_warmup_steps, optim_cfg.lr_warmup_steps_ratio, total)
    min_lr_ratio = 0.0 if optim_cfg.min_lr_ratio is None else float(optim_cfg.min_lr_ratio)
    return lr_schedule(optimizer, str(optim_cfg.lr_scheduler), warmup, total, min_lr_ratio,
                       float(optim_cfg.num_cycles), first_step=0 if optim_cfg.zero_indexed_step else 1)
