"""verl's `fsdp_config.full_determinism` / `fsdp_config.seed`: deterministic kernels and one seed for a debugging run.

Off by default (verl: "only for debugging"). When an engine of a worker process turns it on, the whole process
gets it, with every role and rollout engine colocated there (the last seed set wins): cuBLAS's fixed workspace,
PyTorch's deterministic algorithms (a warning, not an error, where an operator has none), cuDNN without
autotuning, and Python's, NumPy's and PyTorch's generators seeded with `seed`.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch


def determinism_seed(fsdp_configs: Iterable[Any]) -> int | None:
    """The `seed` of the first engine config with `full_determinism` on, among those sharing this process;
    None when none has it."""
    for cfg in fsdp_configs:
        if bool(cfg.full_determinism):
            return int(cfg.seed)
    return None


def enable_full_determinism(seed: int) -> None:
    """Deterministic kernels and seeded generators for this process (call before the first CUDA matmul)."""
    os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"  # read when cuBLAS starts: before any GPU matmul
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # every device
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
