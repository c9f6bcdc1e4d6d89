"""rlpost.utils.determinism: which engine's seed a process takes, and what turning full determinism on sets."""

import os
import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from rlpost.utils.determinism import determinism_seed, enable_full_determinism

pytestmark = pytest.mark.timeout(60)


def test_the_first_engine_with_full_determinism_gives_the_seed():
    off, on7, on9 = (SimpleNamespace(full_determinism=f, seed=s) for f, s in ((False, 1), (True, 7), (True, 9)))
    assert determinism_seed([off, on7, on9]) == 7
    assert determinism_seed([off]) is None and determinism_seed([]) is None


def test_enable_full_determinism_sets_kernels_and_seeds(monkeypatch):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    saved = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
             torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark, torch.get_rng_state())
    try:
        enable_full_determinism(11)
        assert torch.are_deterministic_algorithms_enabled() and torch.is_deterministic_algorithms_warn_only_enabled()
        assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8" and torch.initial_seed() == 11
        draws = (random.random(), float(np.random.rand()), float(torch.rand(1)))
        enable_full_determinism(11)
        assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == draws  # the same seed, same draws
    finally:
        torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = saved[2], saved[3]
        torch.set_rng_state(saved[4])
