"""Checkpoint checksums and the non-finite guard, without a run: a file damaged in place is named, `auto`
resumes from the newest intact checkpoint, `resume_path` refuses and names it, and nothing is deleted."""

import logging
import math

import pytest

from rlpost.trainer.ppo.nonfinite import NonFiniteError, NonFiniteGuard
from rlpost.checkpoint.manager import CheckpointError, CheckpointManager, read_manifest, verify_files


def save(mgr: CheckpointManager, step: int) -> None:
    tmp = mgr.begin(step)
    (tmp / "actor").mkdir()
    (tmp / "actor" / "model_world_size_1_rank_0.pt").write_bytes(bytes(range(256)) * 64)
    (tmp / "data.pt").write_bytes(b"loader state %d" % step)
    mgr.commit(step, {"epoch": 0, "world_size": 1})


def damage(path) -> None:
    """Overwrite 16 bytes in place: same size, different content."""
    with open(path, "r+b") as f:
        f.seek(100)
        f.write(b"\x00" * 16)


@pytest.fixture
def two_checkpoints(tmp_path):
    mgr = CheckpointManager(tmp_path)
    save(mgr, 1)
    save(mgr, 2)
    return mgr, mgr.step_dir(2) / "actor" / "model_world_size_1_rank_0.pt"


def test_manifest_records_every_file(two_checkpoints):
    mgr, _ = two_checkpoints
    files = read_manifest(mgr.step_dir(2))["files"]
    assert sorted(files) == ["actor/model_world_size_1_rank_0.pt", "data.pt"]
    assert files["data.pt"]["size"] == len(b"loader state 2") and len(files["data.pt"]["blake2b"]) == 32


def test_auto_resume_skips_damaged_shard_with_warning(two_checkpoints, caplog):
    mgr, shard = two_checkpoints
    damage(shard)
    with caplog.at_level(logging.WARNING):
        assert mgr.resolve_resume("auto") == mgr.step_dir(1)
    assert f"{shard}: checksum mismatch" in caplog.text and "trying the previous one" in caplog.text
    assert shard.exists() and mgr.step_dir(2).is_dir()  # nothing deleted: a person may want to inspect it


def test_resume_path_to_damaged_shard_names_file_and_intact_one(two_checkpoints):
    mgr, shard = two_checkpoints
    damage(shard)
    with pytest.raises(CheckpointError) as err:
        mgr.resolve_resume("resume_path", mgr.step_dir(2))
    assert f"{shard}: checksum mismatch" in str(err.value)
    assert f"the newest intact checkpoint is {mgr.step_dir(1)} (set trainer.resume_from_path to it)" in str(err.value)


def test_truncated_and_missing_files_are_named(two_checkpoints):
    mgr, shard = two_checkpoints
    shard.write_bytes(b"short")
    (mgr.step_dir(2) / "data.pt").unlink()
    problems = verify_files(mgr.step_dir(2), read_manifest(mgr.step_dir(2)))
    assert problems == [f"{shard}: size 5 bytes, saved as 16384", f"{mgr.step_dir(2) / 'data.pt'}: missing"]


def test_checkpoint_without_checksums_still_resumes(tmp_path):
    mgr = CheckpointManager(tmp_path)
    save(mgr, 1)
    manifest = read_manifest(mgr.step_dir(1))
    del manifest["files"]  # written before checksums existed
    assert verify_files(mgr.step_dir(1), manifest) == []


def test_nonfinite_guard_counts_warns_and_stops(capsys):
    guard = NonFiniteGuard(max_consecutive=2)
    ok = {"actor/pg_loss": 0.1, "actor/grad_norm_nonfinite": 0.0}
    assert guard.observe(1, dict(ok)) is False
    bad = {"actor/pg_loss": math.nan, "actor/grad_norm_nonfinite": 0.5}
    metrics = dict(bad)
    assert guard.observe(2, metrics) is True and metrics["training/nonfinite_steps"] == 1
    assert "step 2 had a non-finite update (actor/grad_norm_nonfinite=0.5, actor/pg_loss=nan)" in capsys.readouterr().out
    assert guard.observe(3, dict(ok)) is False  # the count of consecutive steps resets
    assert guard.observe(4, {"critic/vf_loss": math.inf}) is True
    with pytest.raises(NonFiniteError, match=r"stopping at step 5: 2 consecutive .*trainer.max_nonfinite_steps=2"):
        guard.observe(5, dict(bad))
    assert guard.total == 3
