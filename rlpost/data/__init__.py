"""Datasets and loaders for RL prompts."""

from rlpost.data.loader import (
    EpochSeededSampler,
    ResumableLoader,
    create_rl_sampler,
    create_train_loader,
    create_val_loader,
)
from rlpost.data.rl_dataset import RLHFDataset, collate_fn, create_rl_dataset

__all__ = [
    "EpochSeededSampler",
    "RLHFDataset",
    "ResumableLoader",
    "collate_fn",
    "create_rl_dataset",
    "create_rl_sampler",
    "create_train_loader",
    "create_val_loader",
]
