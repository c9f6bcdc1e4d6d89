"""verl's path `verl.utils.ulysses`: the same module as `rlpost.engine.ulysses`."""

import sys

from rlpost.engine import ulysses as _module

sys.modules[__name__] = _module
