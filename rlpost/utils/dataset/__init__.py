"""verl import-path alias: `verl.utils.dataset` -> `rlpost.utils.dataset` (the code lives in `rlpost.data`)."""

from rlpost.data.rl_dataset import RLHFDataset, collate_fn
from rlpost.data.sft_dataset import SFTDataset

__all__ = ["RLHFDataset", "SFTDataset", "collate_fn"]
