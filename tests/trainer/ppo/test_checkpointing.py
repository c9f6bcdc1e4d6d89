"""Resume checks made before any worker starts: a finished run ends at once, a damaged resume_path is named."""

import pytest
from hydra import compose, initialize_config_dir

import rlpost.trainer.config as config_pkg
from rlpost.trainer.ppo.checkpointing import already_complete, finished_run
from rlpost.checkpoint.manager import CheckpointError, CheckpointManager

pytestmark = pytest.mark.timeout(60)


def config(root, *extra):
    with initialize_config_dir(config_dir=config_pkg.__path__[0], version_base=None):
        return compose("ppo_trainer", overrides=[f"trainer.default_local_dir={root}", *extra])


def save(root, step: int) -> None:
    manager = CheckpointManager(root)
    tmp = manager.begin(step)
    (tmp / "shard.pt").write_bytes(bytes([step]) * 32)
    manager.commit(step, {"world_size": 2})


def test_finished_run_is_found_before_ray(tmp_path):
    save(tmp_path, 2)
    save(tmp_path, 4)
    assert finished_run(config(tmp_path), 4) == 4
    assert finished_run(config(tmp_path), 5) is None  # steps left: resolved when the workers load it
    assert finished_run(config(tmp_path, "trainer.resume_mode=disable"), 4) is None
    assert finished_run(config(tmp_path, "trainer.resume_mode=resume_path",
                               f"trainer.resume_from_path={tmp_path / 'global_step_2'}"), 4) is None
    assert already_complete(4, 4) == "[rlpost] training already complete: checkpoint at step 4 of 4; nothing to do."


def test_damaged_checkpoints_are_not_taken_for_a_finished_run(tmp_path):
    save(tmp_path, 2)
    save(tmp_path, 4)
    shard = tmp_path / "global_step_4" / "shard.pt"
    shard.write_bytes(b"\xff" * 32)  # same size, other bytes
    assert finished_run(config(tmp_path), 4) is None  # auto falls back to step 2: two steps left
    with pytest.raises(CheckpointError, match=f"{shard}: checksum mismatch.*newest intact checkpoint is "
                                              f"{tmp_path / 'global_step_2'}"):
        finished_run(config(tmp_path, "trainer.resume_mode=resume_path",
                            f"trainer.resume_from_path={tmp_path / 'global_step_4'}"), 4)
