"""Faults met at start-up, each as a user meets it through `main_ppo` (in this process, Ray's start replaced by a
guard, or as a command for the command-line cases): the dry run's look at the model folders, a relative
`--config-path`, a user YAML without a defaults list, a full disk, resuming with changed data or an incompatible
config, metrics rows of steps trained again, prompts without text."""

import contextlib
import io
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
from hydra import compose, initialize_config_dir

import rlpost.single_controller.ray.init as ray_init
import rlpost.trainer.config as config_pkg
from rlpost.trainer.config import ConfigError
from rlpost.trainer.config.overrides import check_user_yaml, resolve_config_path
from rlpost.trainer.main_ppo import run
from rlpost.checkpoint.manager import DATA_FILE, CheckpointManager, build_manifest
from rlpost.utils.tracking import Tracking
from _e2e import make_data

pytestmark = pytest.mark.timeout(180)
CONFIG_DIR = config_pkg.__path__[0]
ENTRY_DIR = str(Path(config_pkg.__path__[0]).parent)  # rlpost/trainer: where main_ppo lives
REPO = Path(__file__).resolve().parents[2]


class _ReachedRay(Exception):
    """Start-up checks passed: the launch would start Ray now."""


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("start_up_data")
    make_data(root)
    return root / "data"


def _overrides(model, data, run_dir, *extra):
    return ["trainer.device=cpu", "trainer.n_gpus_per_node=2", "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
            f"actor_rollout_ref.model.path={model}", f"data.train_files={data / 'train.parquet'}", "data.val_files=null",
            "data.train_batch_size=4", "data.max_prompt_length=32", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2", "algorithm.adv_estimator=grpo",
            "actor_rollout_ref.rollout.n=2", "trainer.logger=[console]", f"trainer.default_local_dir={run_dir}", *extra]


def _compose(overrides):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        return compose("ppo_trainer", overrides=overrides)


def _launch(overrides, monkeypatch):
    """(exit status or _ReachedRay, stdout, stderr) of one in-process launch that may not start Ray."""
    def reached_ray(*args, **kwargs):
        raise _ReachedRay()

    monkeypatch.setattr(ray_init, "init_ray", reached_ray)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = run(_compose(overrides))
        except _ReachedRay:
            status = _ReachedRay
    return status, out.getvalue(), err.getvalue()


def test_dry_run_names_a_model_folder_missing_here(data, tmp_path, monkeypatch):
    status, out, err = _launch(_overrides("/no/such/model", data, tmp_path / "run", "trainer.dry_run=true"),
                               monkeypatch)
    assert status == 0 and "rlpost dry run" in out  # the plan still prints: it may be for another machine
    assert ("dry run: actor_rollout_ref.model.path='/no/such/model' is not a local folder" in err
            and "A run on this machine stops there at start-up" in err), err


def test_relative_config_path_is_found_where_hydra_looks_then_in_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # verl's scripts: `--config-path=config` beside the entry module (the packaged config)
    assert resolve_config_path(["--config-path=config", "--config-name=ppo_trainer", "a=1"], ENTRY_DIR) == \
        [f"--config-path={CONFIG_DIR}", "--config-name=ppo_trainer", "a=1"]
    assert resolve_config_path(["--config-path", "./config"], ENTRY_DIR) == [f"--config-path={CONFIG_DIR}"]
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "exp.yaml").write_text("defaults: [ppo_trainer, _self_]\n")
    assert resolve_config_path(["-cp", "mine", "-cn", "exp"], ENTRY_DIR) == \
        [f"--config-path={tmp_path / 'mine'}", "-cn", "exp"]
    with pytest.raises(ConfigError) as err:
        resolve_config_path(["--config-path=nothere", "--config-name=exp"], ENTRY_DIR)
    assert (f"--config-path=nothere: no exp.yaml in {ENTRY_DIR}/nothere (beside the entry module, where Hydra "
            f"looks) nor in {tmp_path}/nothere (the working directory)") in str(err.value)


def test_verl_scripts_relative_config_path_runs_from_any_folder(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "rlpost.trainer.main_ppo", "--config-path=config",
                           "--config-name=ppo_trainer", "data.train_batch_size=16", "--cfg", "job"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "train_batch_size: 16" in proc.stdout


def test_user_yaml_without_defaults_says_what_to_add(tmp_path):
    (tmp_path / "mine.yaml").write_text("data:\n  train_batch_size: 8\n")
    with pytest.raises(ConfigError) as err:
        check_user_yaml([f"--config-path={tmp_path}", "--config-name=mine"])
    assert f"{tmp_path / 'mine.yaml'} has no defaults list" in str(err.value)
    assert "add `defaults: [ppo_trainer, _self_]` at its top" in str(err.value)


@pytest.fixture
def full_disk(tmp_path):
    """A 1 MiB tmpfs filled to the last byte (a real full disk; needs the right to mount)."""
    mount = tmp_path / "full"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        with contextlib.suppress(OSError), open(mount / "filler", "wb") as f:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=False)


def test_a_full_disk_stops_start_up_before_ray(data, tiny_model_dir, full_disk, monkeypatch):
    status, _, err = _launch(_overrides(tiny_model_dir, data, full_disk / "run"), monkeypatch)
    assert status == 2, err
    assert f"trainer.default_local_dir='{full_disk}/run' cannot hold checkpoints and logs: the disk of {full_disk} " \
           "is full (0.0 MiB free, under 64 MiB)" in err
    assert "point trainer.default_local_dir at a larger disk" in err


def _checkpoint(cfg, step: int, epoch: int, batches_done: int) -> Path:
    """A committed checkpoint as the trainer writes it (manifest from the saving run's config, data position)."""
    manager = CheckpointManager(cfg.trainer.default_local_dir)
    tmp = manager.begin(step)
    (tmp / "actor").mkdir()
    (tmp / "actor" / "model_rank_0.pt").write_bytes(b"\0" * 16)
    torch.save({"epoch": epoch, "batches_done": batches_done, "seed": 1}, tmp / DATA_FILE)
    manifest = build_manifest(step, epoch, 2, cfg, ["model"])
    manifest["train_files"] = [str(cfg.data.train_files)]
    return manager.commit(step, manifest)


def test_resume_with_an_incompatible_config_stops_before_ray(data, tiny_model_dir, tmp_path, monkeypatch):
    saved = _compose(_overrides(tiny_model_dir, data, tmp_path / "run"))
    path = _checkpoint(saved, 1, 0, 1)
    status, _, err = _launch(_overrides(tiny_model_dir, data, tmp_path / "run", "actor_rollout_ref.rollout.n=4"),
                             monkeypatch)
    assert status == 2, err
    assert f"cannot resume from {path} (trainer.resume_mode=auto)" in err
    assert "actor_rollout_ref.rollout.n: checkpoint=2 now=4" in err


def test_resume_with_other_training_files_says_which_position_is_used(data, tiny_model_dir, tmp_path, monkeypatch):
    saved = _compose(_overrides(tiny_model_dir, data, tmp_path / "run"))
    path = _checkpoint(saved, 1, 0, 1)
    other = tmp_path / "other.parquet"
    pd.read_parquet(data / "train.parquet").iloc[::-1].to_parquet(other)
    status, out, err = _launch(_overrides(tiny_model_dir, data, tmp_path / "run", f"data.train_files={other}"),
                               monkeypatch)
    assert status is _ReachedRay, err  # accepted, and said
    assert (f"[rlpost] resuming {path}: data.train_files changed (['{data / 'train.parquet'}'] at the save, "
            f"['{other}'] now); the checkpoint's data position is used: epoch 0, batch 1 of that epoch") in out


def test_resumed_run_moves_rows_of_steps_trained_again(tmp_path, capsys):
    first = Tracking("p", "e", default_backend="file", log_dir=tmp_path)
    for step in (1, 2, 3, 4):
        first.log({"x": float(step)}, step=step)
    first.finish()
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 5, "x"')  # torn by the crash
    second = Tracking("p", "e", default_backend="file", log_dir=tmp_path)
    second.resume_at(2)  # the checkpoint of step 4 was damaged; the run fell back to step 2
    second.log({"x": 30.0}, step=3)
    second.finish()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["x"]) for r in rows] == [(1, 1.0), (2, 2.0), (3, 30.0)]
    moved = (tmp_path / "metrics_superseded.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in moved[:2]] == [3, 4] and moved[2] == '{"step": 5, "x"'
    assert "2 row(s) of steps 3-4 are after the checkpoint this run resumes from (step 2)" in capsys.readouterr().out


def test_some_prompts_without_text_are_warned_with_the_first_row(data, tiny_model_dir, tmp_path, caplog):
    from rlpost.data.rl_dataset import create_rl_dataset
    from rlpost.utils.tokenizer import hf_tokenizer

    frame = pd.read_parquet(data / "train.parquet")
    frame.at[3, "prompt"] = [{"role": "user", "content": "  "}]
    frame.at[6, "prompt"] = [{"role": "system", "content": "be brief"}, {"role": "user", "content": ""}]
    path = tmp_path / "two_empty.parquet"
    frame.to_parquet(path)
    cfg = _compose(_overrides(tiny_model_dir, data, tmp_path / "run", f"data.train_files={path}"))
    with caplog.at_level(logging.WARNING):
        dataset = create_rl_dataset(str(path), cfg.data, hf_tokenizer(tiny_model_dir))
    assert len(dataset) == 8  # kept: a warning, not a refusal
    assert f"2 of 8 rows of {path} have a prompt without text" in caplog.text
    assert f"the first: {path} row 3" in caplog.text
