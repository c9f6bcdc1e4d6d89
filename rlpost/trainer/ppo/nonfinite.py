"""Non-finite steps: count them, stop a run that keeps producing them, and keep their weights off disk.

The workers already skip an optimiser step whose grad norm is not finite (`workers.batching.optimizer_step`
reports `<role>/grad_norm_nonfinite`). A run whose every step is skipped learns nothing while looking
alive, and one whose weights turned NaN would save them as the newest checkpoint; this guard stops both.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

# Metrics whose non-finite value (or, for the flags, a value > 0) marks the step as non-finite.
NONFINITE_FLAGS = ("actor/grad_norm_nonfinite", "critic/grad_norm_nonfinite")
LOSSES = ("actor/pg_loss", "critic/vf_loss")


class NonFiniteError(RuntimeError):
    """`trainer.max_nonfinite_steps` consecutive steps had a non-finite loss or grad norm."""


class NonFiniteGuard:
    """Counts non-finite steps; `observe` raises `NonFiniteError` after `max_consecutive` in a row."""

    def __init__(self, max_consecutive: int):
        self.max_consecutive = int(max_consecutive)
        self.total = 0
        self.consecutive = 0

    @staticmethod
    def bad_metrics(metrics: Mapping[str, Any]) -> list[str]:
        """Names of the step's metrics that show a non-finite update ("actor/pg_loss=nan", ...)."""
        bad = [f"{k}={metrics[k]}" for k in NONFINITE_FLAGS if k in metrics and float(metrics[k]) > 0]
        bad += [f"{k}={metrics[k]}" for k in LOSSES if k in metrics and not math.isfinite(float(metrics[k]))]
        return bad

    def observe(self, step: int, metrics: dict[str, Any]) -> bool:
        """Record step `step`; adds `training/nonfinite_steps` (running total) to `metrics`.

        Returns:
            True when the step was non-finite (the caller must not save a checkpoint after it).

        Raises:
            NonFiniteError: the `max_consecutive`-th non-finite step in a row.
        """
        bad = self.bad_metrics(metrics)
        self.consecutive = self.consecutive + 1 if bad else 0
        self.total += bool(bad)
        metrics["training/nonfinite_steps"] = self.total
        if bad:
            print(f"[rlpost] warning: step {step} had a non-finite update ({', '.join(bad)}); its optimiser "
                  f"step was skipped and no checkpoint is saved after it "
                  f"({self.consecutive}/{self.max_consecutive} in a row allowed by trainer.max_nonfinite_steps)")
        if self.consecutive >= self.max_consecutive:
            raise NonFiniteError(
                f"stopping at step {step}: {self.consecutive} consecutive steps had a non-finite loss or grad "
                f"norm ({', '.join(bad)}; trainer.max_nonfinite_steps={self.max_consecutive}). The last saved "
                f"checkpoint holds finite weights. Usual causes: a learning rate too high "
                f"(actor_rollout_ref.actor.optim.lr), a damaged checkpoint, or fp16 overflow; lower the LR or "
                f"resume from an earlier checkpoint")
        return bool(bad)
