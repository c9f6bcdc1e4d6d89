"""The path `rlpost.workers.fsdp_checkpoint`: the same module as `rlpost.checkpoint.fsdp`."""

import sys

from rlpost.checkpoint import fsdp as _module

sys.modules[__name__] = _module
