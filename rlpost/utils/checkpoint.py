"""The path `rlpost.utils.checkpoint`: the same module as `rlpost.checkpoint.manager`."""

import sys

from rlpost.checkpoint import manager as _module

sys.modules[__name__] = _module
