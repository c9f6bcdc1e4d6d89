"""verl's entry point `python -m verl.model_merger ...` as `python -m rlpost.model_merger ...`: the module
`rlpost.checkpoint.merger` (imported under this name too)."""

import sys

from rlpost.checkpoint import merger as _module

if __name__ == "__main__":
    sys.exit(_module.main())
sys.modules[__name__] = _module
