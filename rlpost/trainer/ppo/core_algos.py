"""verl's module path for the algorithm functions: `from rlpost.trainer.ppo import core_algos`.

The code lives in `rlpost.algos` (pure functions over tensors, split by topic; see its docstring).
This module re-exports every public name of that package, plus the masked reductions verl keeps here
(from `rlpost.utils.masked`), so verl-style imports keep working. verl's registry dicts are the live
mappings of rlpost's registries: an entry a recipe adds to `ADV_ESTIMATOR_REGISTRY` is a registered estimator.
"""

from rlpost.algos import *  # noqa: F403  (the re-export is the point of this module)
from rlpost.algos import __all__ as _ALGOS_ALL
from rlpost.algos import ADV_ESTIMATORS, POLICY_LOSSES
from rlpost.utils.masked import masked_mean, masked_sum, masked_var, masked_whiten

ADV_ESTIMATOR_REGISTRY = ADV_ESTIMATORS.mapping()
POLICY_LOSS_REGISTRY = POLICY_LOSSES.mapping()

__all__ = [*_ALGOS_ALL, "ADV_ESTIMATOR_REGISTRY", "POLICY_LOSS_REGISTRY", "masked_mean", "masked_sum", "masked_var",
           "masked_whiten"]
