"""A checkpoint that cannot be written says why (full disk, no permission, a file where the folder should be)
naming the path, removes its partial `.tmp_global_step_N` folder, and leaves the saved checkpoints intact.

The full disk and the missing permission are injected as the OSError the write function raises (a small
full file system needs root to mount, and root may write anywhere); the rest is the real trainer code."""

import errno
import os
import traceback

import pytest
from hydra import compose, initialize_config_dir

import rlpost.trainer.config as config_pkg
import rlpost.trainer.ppo.checkpointing as checkpointing
from rlpost.single_controller.ray.errors import WorkerGroupError
from rlpost.trainer.main_ppo import run
from rlpost.trainer.ppo.checkpointing import TrainerCheckpointer
from rlpost.checkpoint.manager import CheckpointError, read_manifest, verify_files

pytestmark = pytest.mark.timeout(120)
CONFIG_DIR = config_pkg.__path__[0]


class Actor:
    """Writes a shard like the real worker group, then raises `fail` (an exception or None)."""

    def __init__(self):
        self.fail = None

    def save_checkpoint(self, local_path, global_step, save_contents):
        os.makedirs(local_path, exist_ok=True)
        with open(os.path.join(local_path, "model_rank_0.pt"), "wb") as f:
            f.write(bytes([global_step]) * 64)
        if self.fail is not None:
            raise self.fail


class Workers:
    def __init__(self):
        self.actor_rollout, self.critic = Actor(), None


class Loader:
    def state_dict(self):
        return {"position": 3}


@pytest.fixture
def checkpointer(tmp_path):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        cfg = compose("ppo_trainer", overrides=[f"trainer.default_local_dir={tmp_path / 'run'}"])
    ckpt = TrainerCheckpointer(cfg, Workers(), Loader())
    ckpt.save(1, 0)  # one good checkpoint that every failure below must leave intact
    return ckpt


def assert_nothing_lost(ckpt):
    root = ckpt.manager.root
    assert not list(root.glob(".tmp_*")), list(root.iterdir())
    assert sorted(p.name for p in root.glob("global_step_*")) == ["global_step_1"]
    assert verify_files(root / "global_step_1", read_manifest(root / "global_step_1")) == []
    assert (root / "latest_checkpointed_iteration.txt").read_text() == "1"


def worker_failure(exc: OSError) -> WorkerGroupError:
    """What the driver receives when a worker's save raises `exc`: its traceback as text, per rank."""
    try:
        raise exc
    except OSError:
        text = traceback.format_exc()
    return WorkerGroupError("workers/actor_rollout", "save_checkpoint", {0: text, 1: text})


def test_disk_full_in_a_worker_names_it_and_removes_the_partial_save(checkpointer):
    shard = checkpointer.manager.tmp_dir(2) / "actor" / "optim_world_size_2_rank_1.pt"
    checkpointer.workers.actor_rollout.fail = worker_failure(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC),
                                                                     str(shard)))
    with pytest.raises(CheckpointError) as info:
        checkpointer.save(2, 0)
    text = str(info.value)
    assert f"cannot save the checkpoint of step 2: No space left on device writing {shard} (" in text
    assert "MiB free there); free space on that disk or point trainer.default_local_dir at a larger one" in text
    assert f"The partial save {checkpointer.manager.tmp_dir(2)} was removed" in text
    assert f"the newest saved checkpoint, {checkpointer.manager.step_dir(1)}, is intact" in text
    assert_nothing_lost(checkpointer)


def test_permission_denied_on_the_driver_write(checkpointer, monkeypatch):
    def denied(obj, path):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), path)

    monkeypatch.setattr(checkpointing.torch, "save", denied)
    with pytest.raises(CheckpointError, match=r"permission denied writing .*\.tmp_global_step_2/data\.pt; make the "
                                              r"folder writable for this user or point trainer\.default_local_dir"):
        checkpointer.save(2, 0)
    assert_nothing_lost(checkpointer)


def test_torch_write_failure_on_a_full_disk_reads_as_no_space(checkpointer, monkeypatch):
    # PyTorch's zip writer reports a full disk without an errno; the free space decides
    error = RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 4096 vs 2048")
    checkpointer.workers.actor_rollout.fail = error
    monkeypatch.setattr("rlpost.utils.disk_errors._LOW_SPACE", 1 << 62)  # every disk counts as full
    with pytest.raises(CheckpointError, match="No space left on device writing .*tmp_global_step_2"):
        checkpointer.save(2, 0)
    assert_nothing_lost(checkpointer)


def test_other_errors_pass_through_but_the_partial_save_is_removed(checkpointer):
    checkpointer.workers.actor_rollout.fail = RuntimeError("a bug in the worker")
    with pytest.raises(RuntimeError, match="a bug in the worker"):
        checkpointer.save(2, 0)
    assert_nothing_lost(checkpointer)


@pytest.mark.parametrize("where", ["itself", "parent"])
def test_checkpoint_folder_that_is_a_file_stops_start_up(where, tiny_model_dir, tmp_path, capsys):
    blocker = tmp_path / "run"
    blocker.write_text("not a folder")
    local_dir = blocker if where == "itself" else blocker / "sub"
    train = tmp_path / "train.parquet"
    train.write_bytes(b"")  # only its existence is checked before the output folder
    overrides = ["trainer.device=cpu", "trainer.n_gpus_per_node=2", "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
                 f"actor_rollout_ref.model.path={tiny_model_dir}", f"trainer.default_local_dir={local_dir}",
                 f"data.train_files={train}", "data.val_files=null", "algorithm.adv_estimator=grpo",
                 "actor_rollout_ref.rollout.n=2"]
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        assert run(compose("ppo_trainer", overrides=overrides)) == 2
    err = capsys.readouterr().err
    assert f"trainer.default_local_dir={str(local_dir)!r} cannot hold checkpoints and logs: {blocker} is a file, " \
           "not a folder; remove or rename it, or choose another folder" in err
    assert blocker.read_text() == "not a folder"


def test_ctrl_c_during_a_save_removes_the_partial_folder(checkpointer, capsys):
    checkpointer.workers.actor_rollout.fail = KeyboardInterrupt()  # arrives while the shard is being written
    with pytest.raises(KeyboardInterrupt):
        checkpointer.save(2, 0)
    assert_nothing_lost(checkpointer)
    tmp = checkpointer.manager.root / ".tmp_global_step_2"
    assert f"[rlpost] the save of step 2 was interrupted; its partial folder {tmp} was removed" in \
        capsys.readouterr().out
