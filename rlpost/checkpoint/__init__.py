"""Checkpoints: one format, written, managed and merged here.

    format.py    every file and folder name of a checkpoint, and the shard meta (`fsdp_meta.json`)
    manager.py   checkpoint folders: atomic saves, manifests with checksums, retention, resume resolution
    fsdp.py      a role's per-rank FSDP2 shards (model, optimiser, RNG + LR scheduler), HF config, LoRA adapter
    merger.py    `python -m rlpost.model_merger`: a role folder into a transformers folder

verl's module paths `rlpost.utils.checkpoint`, `rlpost.workers.fsdp_checkpoint` and `rlpost.model_merger` are
the same modules.
"""
