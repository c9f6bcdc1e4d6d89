"""Build everything a PPO run needs from a validated config, then train.

Order matters: data and the reward function are checked before Ray starts (a missing column or a
raising reward function fails in seconds, not after the engines are up); the rollout-holding group is
initialised last so the engine sizes its cache after the other models have allocated.
"""

from __future__ import annotations

import logging
import os

from omegaconf import DictConfig, OmegaConf

logger = logging.getLogger(__name__)


class InputError(Exception):
    """A data file, tokenizer or reward function that cannot be used; raised before Ray starts."""


def run_ppo(config: DictConfig) -> dict[str, float]:
    """Train with a validated `ppo_trainer` config; returns the last step's metrics."""
    from rlpost.trainer.ppo.ray_trainer import RayPPOTrainer, inject_total_training_steps, total_training_steps

    from rlpost.reward import RewardFunctionError

    try:  # bad input fails here, in seconds and with one message, before Ray and the models start
        tokenizer = load_tokenizer(config)
        train_loader, val_loader = build_dataloaders(config, tokenizer)
        reward_fn, val_reward_fn = build_reward_fns(config, tokenizer, val_loader)
    except (OSError, ValueError, KeyError, RewardFunctionError) as err:
        raise InputError(str(err)) from err
    inject_total_training_steps(config, total_training_steps(config, len(train_loader)))

    from rlpost.single_controller.ray.init import finish_ray, init_ray
    from rlpost.trainer.ppo.roles import build_worker_groups
    from rlpost.utils.tracking import Tracking

    init_ray(config.ray_init)
    tracker = None
    try:
        workers = build_worker_groups(config)
        trainer = RayPPOTrainer(config, tokenizer, workers, reward_fn, val_reward_fn, train_loader, val_loader)
        tracker = Tracking(
            project_name=config.trainer.project_name,
            experiment_name=config.trainer.experiment_name,
            default_backend=list(config.trainer.logger),
            config=OmegaConf.to_container(config, resolve=True),
            log_dir=config.trainer.default_local_dir,
        )
        return trainer.fit(tracker)
    finally:
        if tracker is not None:
            tracker.finish()
        finish_ray(config.ray_init)


def load_tokenizer(config: DictConfig):
    """The policy tokenizer (`data.tokenizer` overrides the model path), left padding for generation."""
    from transformers import AutoTokenizer

    key = "data.tokenizer" if config.data.get("tokenizer") else "actor_rollout_ref.model.path"
    path = os.path.expanduser(config.data.get("tokenizer") or config.actor_rollout_ref.model.path)
    if not os.path.isdir(path):
        raise InputError(f"{key}={path!r} is not a local folder; no model hub is used at run time: point it at a "
                         f"HF model folder (config.json + tokenizer), e.g. one made by scripts/make_tiny_model.py")
    tok = AutoTokenizer.from_pretrained(path, trust_remote_code=config.data.get("trust_remote_code", False))
    tok.padding_side = "left"
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def build_dataloaders(config: DictConfig, tokenizer):
    """Train loader (resumable, `data.train_batch_size` prompts per batch) and the validation loader."""
    from rlpost.data.loader import create_train_loader, create_val_loader
    from rlpost.data.rl_dataset import collate_fn, create_rl_dataset

    data_cfg = config.data
    train_ds = create_rl_dataset(data_cfg.train_files, data_cfg, tokenizer)
    train_loader = create_train_loader(data_cfg, train_ds, collate_fn)
    if len(train_loader) == 0:
        raise ValueError(
            f"data.train_batch_size={data_cfg.train_batch_size} is larger than the training set "
            f"({len(train_ds)} rows in {data_cfg.train_files}): lower data.train_batch_size to <= {len(train_ds)}")
    val_loader = None
    if data_cfg.get("val_files"):
        val_loader = create_val_loader(data_cfg, create_rl_dataset(data_cfg.val_files, data_cfg, tokenizer),
                                       collate_fn)
    return train_loader, val_loader


def build_reward_fns(config: DictConfig, tokenizer, val_loader):
    """Reward managers for training and validation, checked on a few validation samples first."""
    from rlpost.reward import check_reward_fn, load_reward_manager, reward_fn_spec

    kwargs = dict(config.reward_model.get("reward_kwargs", {}) or {})
    reward_fn = load_reward_manager(config, tokenizer, num_examine=0, **kwargs)
    val_reward_fn = load_reward_manager(config, tokenizer, num_examine=1, **kwargs)
    if val_loader is not None and not config.reward_model.enable:
        check_reward_fn(reward_fn_spec(config).resolve(), val_loader.dataset,
                        reward_fn_key=config.data.get("reward_fn_key", "data_source"))
    return reward_fn, val_reward_fn
