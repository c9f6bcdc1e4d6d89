"""The trainer's data loaders: resumable training batches of prompts, and the validation loader."""

from __future__ import annotations

from typing import Any, Callable

from rlpost.config.schema import PPOTrainerConfig
from torch.utils.data import Dataset, Sampler


def create_dataloaders(config: PPOTrainerConfig, tokenizer: Any, processor: Any = None,
                       train_dataset: Dataset | None = None, val_dataset: Dataset | None = None,
                       collate_fn: Callable | None = None,
                       train_sampler: Sampler | None = None):
    """(train loader, validation loader or None), building from `data.*` whatever is not given.

    The train loader yields `data.gen_batch_size` prompts per batch with `algorithm.filter_groups.enable`
    (dynamic sampling draws several per step) or `rollout.over_sample_rate` > 0 (the slowest groups are cut),
    else `data.train_batch_size`. There is no validation
    loader when neither `val_dataset` nor `data.val_files` is given.

    Raises:
        ValueError: the training set holds fewer prompts than one batch.
    """
    from rlpost.data.loader import ResumableLoader, create_rl_sampler, create_val_loader
    from rlpost.data.rl_dataset import collate_fn as default_collate
    from rlpost.data.rl_dataset import create_rl_dataset

    data_cfg = config.data
    collate_fn = collate_fn or default_collate
    if train_dataset is None:
        train_dataset = create_rl_dataset(data_cfg.train_files, data_cfg, tokenizer, processor)
    if val_dataset is None and data_cfg.val_files:
        val_dataset = create_rl_dataset(data_cfg.val_files, data_cfg, tokenizer, processor, is_train=False)
    over_sample = config.actor_rollout_ref.rollout.over_sample_rate > 0
    key = "gen_batch_size" if config.algorithm.filter_groups.enable or over_sample else "train_batch_size"
    batch_size = int(data_cfg[key])
    train_loader = ResumableLoader(
        train_dataset, batch_size, train_sampler or create_rl_sampler(data_cfg, train_dataset), collate_fn,
        drop_last=True, num_workers=int(data_cfg.dataloader_num_workers or 0))
    if len(train_dataset) == 0:
        raise ValueError(f"data.train_files={data_cfg.train_files}: no training rows"
                         + (" left after filter_overlong_prompts" if data_cfg.filter_overlong_prompts else "")
                         + "; give a file with prompts (or raise data.max_prompt_length)")
    if len(train_loader) == 0:
        raise ValueError(f"data.{key}={batch_size} is larger than the training set ({len(train_dataset)} rows in "
                         f"{data_cfg.train_files}): lower data.{key} to <= {len(train_dataset)}")
    val_loader = None if val_dataset is None else create_val_loader(data_cfg, val_dataset, collate_fn)
    return train_loader, val_loader


def total_training_steps(config: PPOTrainerConfig, batches_per_epoch: int) -> int:
    """`trainer.total_training_steps` when set, else epochs x batches per epoch x the estimator's steps per batch
    (2 with CoDaPO: each batch is an original and a focused step)."""
    from rlpost.algos.advantages import estimator_needs

    per_batch = estimator_needs(config.algorithm.adv_estimator).steps_per_batch
    steps = batches_per_epoch * config.trainer.total_epochs * per_batch
    if config.trainer.total_training_steps is not None:
        steps = int(config.trainer.total_training_steps)
    return steps
