"""Trainer-level checkpoints: one atomic `global_step_N/` folder per save, and resuming from one.

The workers write their own shards (`actor/`, `critic/`) into the folder the driver opened with
`CheckpointManager.begin`; the driver adds the data-loader position and commits (rename + latest file).
"""

from __future__ import annotations

import logging
import os
import shutil
from typing import Any

import torch
from rlpost.config.schema import PPOTrainerConfig

from rlpost.checkpoint.manager import (
    DATA_FILE,
    CheckpointError,
    CheckpointManager,
    build_manifest,
    check_compatible,
    config_fields,
    config_hash,
    effective_keep,
    read_manifest,
    step_of,
)

logger = logging.getLogger(__name__)


def finished_run(config: PPOTrainerConfig, total_steps: int) -> int | None:
    """Before any worker starts: the step of the checkpoint this run would resume from when it already
    reached `total_steps` (nothing left to train), else None.

    Raises:
        CheckpointError: `trainer.resume_mode=resume_path` names a damaged checkpoint (found here in seconds
            instead of after the workers loaded their models).
    """
    trainer_cfg = config.trainer
    manager = CheckpointManager(os.path.expanduser(trainer_cfg.default_local_dir))
    latest = manager.find_latest_complete()
    if trainer_cfg.resume_mode == "auto" and (latest is None or latest[0] < total_steps):
        return None  # the usual start: resolved (and verified) once, when the workers load it
    if trainer_cfg.resume_mode == "disable":
        return None
    path = manager.resolve_resume(trainer_cfg.resume_mode, trainer_cfg.resume_from_path)
    step = step_of(path) if path is not None else 0
    return step if step >= total_steps else None


def _train_files(config: PPOTrainerConfig) -> list[str]:
    files = config.data.train_files
    return [str(files)] if isinstance(files, str) else [str(f) for f in files]


def check_resume_inputs(config: PPOTrainerConfig) -> None:
    """Before any worker starts: the checkpoint this run would resume from was saved by a compatible run (else
    the workers would refuse it after loading their models), and a changed `data.train_files` is said, with the
    data position the run continues from.

    Raises:
        CheckpointError: a key that must be equal to resume differs (named, with both values).
    """
    trainer_cfg = config.trainer
    manager = CheckpointManager(os.path.expanduser(trainer_cfg.default_local_dir))
    if trainer_cfg.resume_mode == "disable":
        return
    if trainer_cfg.resume_mode == "auto":
        latest = manager.find_latest_complete()
        path = None if latest is None else latest[1]
    else:
        path = manager.resolve_resume(trainer_cfg.resume_mode, trainer_cfg.resume_from_path)
    manifest = None if path is None else read_manifest(path)
    if manifest is None:
        return
    try:
        check_compatible(manifest, trainer_cfg.n_gpus_per_node * trainer_cfg.nnodes, config_hash(config),
                         config_fields(config))
    except ValueError as err:
        raise CheckpointError(f"cannot resume from {path} (trainer.resume_mode={trainer_cfg.resume_mode}): {err}"
                              ) from None
    saved, now = manifest.get("train_files"), _train_files(config)
    if saved is not None and list(saved) != now:
        position = _data_position(os.path.join(path, DATA_FILE))
        print(f"[rlpost] resuming {path}: data.train_files changed ({saved} at the save, {now} now); the "
              f"checkpoint's data position is used{position}, over the new files' rows in the order data.seed "
              "gives them (start a new run, trainer.resume_mode=disable, to begin the new data from its start)")


def _data_position(data_file: str) -> str:
    """`: epoch e, batch b` of a saved data-loader position, or '' when it cannot be read."""
    try:
        state = torch.load(data_file, weights_only=False)
        return f": epoch {int(state['epoch'])}, batch {int(state['batches_done'])} of that epoch"
    except (OSError, KeyError, TypeError, ValueError, RuntimeError):
        return ""


def already_complete(step: int, total_steps: int) -> str:
    """The line printed when a run has nothing left to train."""
    return f"[rlpost] training already complete: checkpoint at step {step} of {total_steps}; nothing to do."


class TrainerCheckpointer:
    """Saves and restores actor, critic and data-loader state per `trainer.*` checkpoint keys, the batches
    `rollouts` generated ahead of training (`rlpost.trainer.ppo.rollout_driver`) and the step features' state
    (e.g. CoDaPO's pending focused batch, `rlpost.trainer.ppo.features`)."""

    def __init__(self, config: PPOTrainerConfig, workers: Any, train_dataloader, rollouts: Any = None,
                 features: Any = ()):
        self.config = config
        self.trainer_cfg = config.trainer
        self.workers = workers
        self.loader = train_dataloader
        self.rollouts = rollouts
        # each with save(folder) / load(folder)
        self.extra_state = [s for s in (rollouts, *features) if s is not None]
        self.manager = CheckpointManager(os.path.expanduser(self.trainer_cfg.default_local_dir))
        self.world_size = self.trainer_cfg.n_gpus_per_node * self.trainer_cfg.nnodes
        self.start_epoch = 0

    def _contents(self, key: str) -> list[str]:
        return list(self.config.actor_rollout_ref.actor.checkpoint[key])

    def save(self, step: int, epoch: int) -> str:
        """Write `global_step_<step>/` atomically and prune old ones; returns the final path."""
        tmp = self.manager.begin(step)
        contents = self._contents("save_contents")
        try:
            self._write(tmp, step, contents)
            manifest = build_manifest(step, epoch, self.world_size, self.config, contents)
            manifest["train_files"] = _train_files(self.config)  # a resume says when they changed
            final = self.manager.commit(step, manifest)
        except (OSError, RuntimeError) as err:  # worker failures arrive as RuntimeError (WorkerGroupError)
            self.manager.abort(step, err)
        except KeyboardInterrupt:  # Ctrl-C / SIGTERM mid-save: no partial folder is left filling the disk
            shutil.rmtree(tmp, ignore_errors=True)
            print(f"[rlpost] the save of step {step} was interrupted; its partial folder {tmp} was removed")
            raise
        keep = effective_keep(self.trainer_cfg.max_actor_ckpt_to_keep, self.trainer_cfg.max_critic_ckpt_to_keep,
                              self.trainer_cfg.remove_previous_ckpt_in_save)
        for path in self.manager.prune(keep):
            logger.info("removed old checkpoint %s", path)
        print(f"[rlpost] saved checkpoint {final}")
        return str(final)

    def _write(self, tmp: str, step: int, contents: list[str]) -> None:
        """Actor and critic shards (written by the workers) and the data-loader position into `tmp`."""
        self.workers.actor_rollout.save_checkpoint(
            os.path.join(tmp, "actor"), global_step=step, save_contents=contents)
        if self.workers.critic is not None:
            critic_contents = list(self.config.critic.checkpoint.save_contents)
            self.workers.critic.save_checkpoint(
                os.path.join(tmp, "critic"), global_step=step, save_contents=critic_contents)
        torch.save(self.loader.state_dict(), os.path.join(tmp, DATA_FILE))
        for state in self.extra_state:
            state.save(tmp)

    def maybe_resume(self) -> int:
        """Load the checkpoint `trainer.resume_mode` selects; returns its step (0 when starting fresh)."""
        path = self.manager.resolve_resume(self.trainer_cfg.resume_mode, self.trainer_cfg.resume_from_path)
        if path is None:
            print(f"[rlpost] starting fresh (resume_mode={self.trainer_cfg.resume_mode}, "
                  f"no checkpoint used under {self.manager.root})")
            return 0
        manifest = read_manifest(path)
        check_compatible(manifest, self.world_size, config_hash(self.config), config_fields(self.config))
        step = step_of(path)
        load_contents = self._contents("load_contents")
        notes = {"actor_rollout_ref.actor.optim": self.workers.actor_rollout.load_checkpoint(
            os.path.join(path, "actor"), load_contents=load_contents)}
        if self.workers.critic is not None:
            notes["critic.optim"] = self.workers.critic.load_checkpoint(os.path.join(path, "critic"),
                                                                        load_contents=load_contents)
        for group, per_rank in notes.items():
            for note in (per_rank[0] if isinstance(per_rank, list) and per_rank else None) or []:
                print(f"[rlpost] resuming {path}: {group}: {note}: the configured value applies from here on")
        data_file = os.path.join(path, DATA_FILE)
        if os.path.exists(data_file):
            self.loader.load_state_dict(torch.load(data_file, weights_only=False))
        for state in self.extra_state:
            state.load(path)
        self.start_epoch = int(manifest.get("epoch", 0))
        print(f"[rlpost] resumed from {path} (step {step}); continuing at step {step + 1}")
        if self.trainer_cfg.del_local_ckpt_after_load:
            shutil.rmtree(path)
            logger.info("trainer.del_local_ckpt_after_load: deleted %s", path)
        return step
