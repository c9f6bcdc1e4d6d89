"""verl's path `verl.utils.activation_offload`: the same module as `rlpost.engine.activation_offload`."""

import sys

from rlpost.engine import activation_offload as _module

sys.modules[__name__] = _module
