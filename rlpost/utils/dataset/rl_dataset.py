"""verl import-path alias: `from rlpost.utils.dataset.rl_dataset import RLHFDataset, collate_fn`.

The implementation is `rlpost.data.rl_dataset`; this module only re-exports it so recipes written
against verl's path keep working after renaming `verl` to `rlpost`.
"""

from rlpost.data.rl_dataset import RLHFDataset, collate_fn, create_rl_dataset

__all__ = ["RLHFDataset", "collate_fn", "create_rl_dataset"]
