"""Checkpoint folders: atomic commit, crash during a save, retention, resume resolution, compatibility."""

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from rlpost.checkpoint.manager import (
    CONFIG_HASH_KEYS,
    DATA_FILE,
    LATEST_FILE,
    MANIFEST_FILE,
    CheckpointManager,
    build_manifest,
    check_compatible,
    config_fields,
    config_hash,
    effective_keep,
    read_manifest,
)

CFG = {
    "actor_rollout_ref": {"model": {"path": "/m"}, "actor": {"ppo_mini_batch_size": 4}, "rollout": {"n": 2}},
    "data": {"train_batch_size": 8},
    "trainer": {"nnodes": 1, "n_gpus_per_node": 2},
}


def _save(mgr: CheckpointManager, step: int, value: float) -> Path:
    """A full save as the trainer does it: begin, write payload, commit."""
    tmp = mgr.begin(step)
    (tmp / "actor").mkdir()
    torch.save({"w": torch.full((3,), value)}, tmp / "actor" / "model_world_size_1_rank_0.pt")
    torch.save({"epoch": 0, "index": step}, tmp / DATA_FILE)
    return mgr.commit(step, build_manifest(step, epoch=0, world_size=2, cfg=CFG, contents=["model"]))


def test_commit_layout_and_latest_file(tmp_path):
    mgr = CheckpointManager(tmp_path)
    final = _save(mgr, 5, 1.0)
    assert final == tmp_path / "global_step_5"
    assert not (tmp_path / ".tmp_global_step_5").exists()
    assert (tmp_path / LATEST_FILE).read_text() == "5"
    manifest = read_manifest(final)
    assert manifest["complete"] is True and manifest["step"] == 5 and manifest["world_size"] == 2
    assert manifest["config_hash"] == config_hash(CFG) and manifest["contents"] == ["model"]
    assert mgr.find_latest_complete() == (5, final)
    assert mgr.read_latest_file() == 5


def test_resave_same_step_replaces(tmp_path):
    mgr = CheckpointManager(tmp_path)
    _save(mgr, 1, 1.0)
    final = _save(mgr, 1, 2.0)
    loaded = torch.load(final / "actor" / "model_world_size_1_rank_0.pt")
    assert torch.equal(loaded["w"], torch.full((3,), 2.0))
    assert [p.name for p in tmp_path.iterdir() if p.is_dir()] == ["global_step_1"]


def test_crash_between_resave_renames_is_recovered(tmp_path):
    mgr = CheckpointManager(tmp_path)
    final = _save(mgr, 4, 3.0)
    final.rename(tmp_path / ".old_global_step_4_1234")  # the crash window inside commit() of a re-save
    mgr.begin(4)  # the new copy never got renamed
    assert mgr.resolve_resume("auto") == final
    assert torch.equal(torch.load(final / "actor" / "model_world_size_1_rank_0.pt")["w"], torch.full((3,), 3.0))
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["global_step_4"]


def test_commit_without_begin_raises(tmp_path):
    with pytest.raises(FileNotFoundError, match="without begin"):
        CheckpointManager(tmp_path).commit(3, {})


CRASH_SCRIPT = textwrap.dedent(
    """
    import sys, time
    from rlpost.checkpoint.manager import CheckpointManager
    tmp = CheckpointManager(sys.argv[1]).begin(2)
    (tmp / "actor").mkdir()
    (tmp / "actor" / "model_world_size_1_rank_0.pt").write_bytes(b"half-written" * 1000)
    (tmp / "started").write_text("1")
    time.sleep(60)  # killed here, before commit
    """
)


@pytest.mark.timeout(60)
def test_crash_during_save_keeps_previous(tmp_path):
    mgr = CheckpointManager(tmp_path)
    prev = _save(mgr, 1, 7.0)
    # A folder that looks final but never got a complete manifest (e.g. copied by hand, cut short).
    (tmp_path / "global_step_9" / "actor").mkdir(parents=True)
    (tmp_path / "global_step_9" / MANIFEST_FILE).write_text(json.dumps({"step": 9, "complete": False}))

    proc = subprocess.Popen([sys.executable, "-c", CRASH_SCRIPT, str(tmp_path)])
    deadline = time.time() + 50
    while not (tmp_path / ".tmp_global_step_2" / "started").exists():
        assert proc.poll() is None and time.time() < deadline, "crash script did not start the save"
        time.sleep(0.05)
    proc.kill()  # SIGKILL mid-save
    assert proc.wait(timeout=30) == -9

    assert (tmp_path / ".tmp_global_step_2").is_dir()  # the partial save is still there...
    assert mgr.find_latest_complete() == (1, prev)  # ...but never picked
    assert mgr.resolve_resume("auto") == prev
    assert (tmp_path / LATEST_FILE).read_text() == "1"
    loaded = torch.load(prev / "actor" / "model_world_size_1_rank_0.pt")
    assert torch.equal(loaded["w"], torch.full((3,), 7.0))
    assert torch.load(prev / DATA_FILE) == {"epoch": 0, "index": 1}
    with pytest.raises(ValueError, match="not a complete checkpoint"):
        mgr.resolve_resume("resume_path", tmp_path / "global_step_9")

    # The next save of the same step starts clean and completes.
    final = _save(mgr, 2, 8.0)
    assert mgr.find_latest_complete() == (2, final)
    assert not (final / "started").exists()


def test_prune_keeps_exactly_n_complete(tmp_path):
    mgr = CheckpointManager(tmp_path)
    (tmp_path / ".tmp_global_step_99").mkdir(parents=True)  # a crashed save
    for step in range(1, 6):
        _save(mgr, step, float(step))
        mgr.prune(keep=2)
    assert [s for s, _ in mgr.list_complete()] == [4, 5]
    assert not (tmp_path / ".tmp_global_step_99").exists()
    assert mgr.prune(None) == [] and len(mgr.list_complete()) == 2
    assert mgr.prune(0) == [] and len(mgr.list_complete()) == 2


def test_prune_does_not_count_incomplete(tmp_path):
    mgr = CheckpointManager(tmp_path)
    _save(mgr, 1, 1.0)
    (tmp_path / "global_step_7").mkdir()  # no manifest
    _save(mgr, 2, 2.0)
    mgr.prune(keep=1)
    assert [s for s, _ in mgr.list_complete()] == [2]
    assert (tmp_path / "global_step_7").is_dir()


def test_resolve_resume_modes(tmp_path):
    mgr = CheckpointManager(tmp_path / "ckpts")
    assert mgr.resolve_resume("auto") is None  # root does not even exist
    assert mgr.resolve_resume("disable") is None
    first = _save(mgr, 3, 1.0)
    _save(mgr, 6, 1.0)
    assert mgr.resolve_resume("auto").name == "global_step_6"
    assert mgr.resolve_resume("disable") is None
    assert mgr.resolve_resume("resume_path", str(first)) == first
    with pytest.raises(ValueError, match="needs trainer.resume_from_path"):
        mgr.resolve_resume("resume_path", None)
    with pytest.raises(ValueError, match="global_step_<N>"):
        mgr.resolve_resume("resume_path", tmp_path)
    with pytest.raises(ValueError, match="not a complete checkpoint"):
        mgr.resolve_resume("resume_path", tmp_path / "ckpts" / "global_step_4")
    with pytest.raises(ValueError, match="resume_mode='latest'"):
        mgr.resolve_resume("latest")


def test_config_hash_covers_documented_keys():
    fields = config_fields(CFG)
    assert list(fields) == list(CONFIG_HASH_KEYS)
    assert fields["data.train_batch_size"] == 8 and fields["critic.model.path"] is None
    other = json.loads(json.dumps(CFG))
    other["data"]["train_batch_size"] = 16
    assert config_hash(other) != config_hash(CFG)
    same = json.loads(json.dumps(CFG))
    same["trainer"]["total_epochs"] = 99  # not a hashed key
    assert config_hash(same) == config_hash(CFG)


def test_config_hash_accepts_dictconfig():
    from omegaconf import OmegaConf

    assert config_hash(OmegaConf.create(CFG)) == config_hash(CFG)


def test_check_compatible_names_the_field():
    manifest = build_manifest(4, epoch=1, world_size=2, cfg=CFG)
    check_compatible(manifest, 2, config_hash(CFG), config_fields(CFG))
    with pytest.raises(ValueError, match="world_size=2.*world_size=4"):
        check_compatible(manifest, 4, config_hash(CFG))
    other = json.loads(json.dumps(CFG))
    other["actor_rollout_ref"]["model"]["path"] = "/other"
    with pytest.raises(ValueError, match=r"actor_rollout_ref.model.path: checkpoint='/m' now='/other'"):
        check_compatible(manifest, 2, config_hash(other), config_fields(other))
    with pytest.raises(ValueError, match="hash"):
        check_compatible(manifest, 2, config_hash(other))


def test_effective_keep():
    assert effective_keep(None, None) is None
    assert effective_keep(3, None) == 3
    assert effective_keep(3, 2) == 2
    assert effective_keep(None, None, remove_previous_ckpt_in_save=True) == 1
    assert effective_keep(0, -1) is None
