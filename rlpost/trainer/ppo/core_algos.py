"""verl's module path for the algorithm functions: `from rlpost.trainer.ppo import core_algos`.

The code lives in `rlpost.algos` (pure functions over tensors, split by topic; see its docstring).
This module re-exports every public name of that package, plus the masked reductions verl keeps here
(from `rlpost.utils.masked`), so verl-style imports keep working.
"""

from rlpost.algos import *  # noqa: F403  (the re-export is the point of this module)
from rlpost.algos import __all__ as _ALGOS_ALL
from rlpost.utils.masked import masked_mean, masked_sum, masked_var, masked_whiten

__all__ = [*_ALGOS_ALL, "masked_mean", "masked_sum", "masked_var", "masked_whiten"]
