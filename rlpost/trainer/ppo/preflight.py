"""Checks of the run's inputs that need the file system or the machine, made before any worker starts.

The config itself is validated earlier (`rlpost.trainer.config`); here: every model folder the run loads,
the data files, and whether this machine has the devices the config asks for. Each failure is one
`ValueError` naming the key, the value and what to use instead.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

from rlpost.trainer.config.roles import need_critic


def check_model_and_data_paths(config: Any) -> None:
    """Every model folder (policy, critic, reward model) and data file the run will read exists."""
    folders = {"actor_rollout_ref.model.path": config.actor_rollout_ref.model.path}
    if need_critic(config):
        folders["critic.model.path"] = config.critic.model.path
    if config.reward_model.enable:
        folders["reward_model.model.path"] = config.reward_model.model.path
    for key, path in folders.items():
        if not os.path.isdir(os.path.expanduser(str(path))):
            raise ValueError(f"{key}={path!r} is not a local folder; no model hub is used at run time: point it at "
                             "a HF model folder (config.json + weights), e.g. one made by scripts/make_tiny_model.py")
    for key in ("data.train_files", "data.val_files"):
        files = config.data[key.split(".")[1]]
        for path in [files] if isinstance(files, str) else list(files or []):
            if not os.path.isfile(os.path.expanduser(str(path))):
                raise ValueError(f"{key}: file not found: {path!r}; give the parquet file(s) of your data, e.g. "
                                 "made by examples/data_preprocess/gsm8k.py")


def check_lora_inputs(config: Any) -> None:
    """With LoRA on: `target_modules` select layers of the model, and a `lora_adapter_path` is an adapter folder
    of the configured rank (its layer shapes are checked when the workers load it)."""
    from rlpost.utils.lora import check_adapter_folder, check_target_modules, lora_enabled

    groups = {"actor_rollout_ref.model": config.actor_rollout_ref.model}
    if need_critic(config):
        groups["critic.model"] = config.critic.model
    for group, model_cfg in groups.items():
        if not lora_enabled(model_cfg):
            continue
        if importlib.util.find_spec("peft") is None:
            raise ValueError(f"{group}.lora_rank={model_cfg.lora_rank} needs PEFT, which is not installed: "
                             "pip install 'rlpost[lora]' (or peft), or set the rank to 0")
        check_target_modules(model_cfg, group)
        if model_cfg.lora_adapter_path is not None:
            check_adapter_folder(str(model_cfg.lora_adapter_path), model_cfg, None, group)


def check_output_folder(config: Any) -> None:
    """`trainer.default_local_dir` can hold checkpoints and logs: no file in its place, writable."""
    from rlpost.utils.checkpoint import unwritable_folder

    path = os.path.abspath(os.path.expanduser(str(config.trainer.default_local_dir)))
    reason = unwritable_folder(path)
    if reason:
        raise ValueError(f"trainer.default_local_dir={path!r} cannot hold checkpoints and logs: {reason}")


def check_devices(config: Any) -> None:
    """One node: the devices `trainer.n_gpus_per_node` asks for exist here (else Ray would wait, then time out)."""
    trainer = config.trainer
    if trainer.nnodes != 1:
        return  # other nodes' devices are Ray's to count
    rollout = config.actor_rollout_ref.rollout
    split = 0 if config.actor_rollout_ref.hybrid_engine else rollout.nnodes * rollout.n_gpus_per_node
    want = trainer.n_gpus_per_node + split
    asked = f"trainer.n_gpus_per_node={trainer.n_gpus_per_node}" + (
        f" + actor_rollout_ref.rollout.nnodes x n_gpus_per_node = {split} rollout = {want}" if split else "")
    if trainer.device == "cuda":
        import torch

        have = torch.cuda.device_count()
        if have < want:
            raise ValueError(f"{asked}, but this machine has {have} CUDA device(s) visible; use "
                             f"{_fit(split, have)}"
                             + ("" if have else " (or trainer.device=cpu)"))
        return
    have = config.ray_init.num_cpus or os.cpu_count() or 1
    if have < want:
        raise ValueError(f"{asked} CPU worker processes (trainer.device=cpu), but Ray has {have} CPU(s) "
                         f"(ray_init.num_cpus or the machine's); use {_fit(split, have)}")


def _fit(split: int, have: int) -> str:
    """A device split that fits `have` devices."""
    if not split:
        return f"trainer.n_gpus_per_node={max(have, 1)}"
    if have >= 2:
        return (f"trainer.n_gpus_per_node={have - max(1, have // 2)} and actor_rollout_ref.rollout.n_gpus_per_node="
                f"{max(1, have // 2)} (rollout.nnodes=1)")
    return "actor_rollout_ref.hybrid_engine=true (trainer.n_gpus_per_node=1)"
