"""`python -m rlpost.trainer.main_ppo`: search path, error exit, dry run of a user's own YAML."""

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from hydra import compose, initialize_config_dir

from rlpost.trainer import main_ppo
from rlpost.trainer.config import CONFIG_DIR

REPO = Path(__file__).resolve().parents[2]


def test_search_path_is_added_or_merged():
    sp = "hydra.searchpath=[pkg://rlpost.trainer.config]"
    assert main_ppo.with_search_path(["prog", "a=1"]) == ["prog", sp, "a=1"]
    # beside the overrides, whatever flags come before or after them
    assert main_ppo.with_search_path(["prog", "a=1", "--cfg", "job"]) == ["prog", sp, "a=1", "--cfg", "job"]
    assert main_ppo.with_search_path(["prog", "--cfg", "job", "a=1"]) == ["prog", "--cfg", "job", sp, "a=1"]
    assert main_ppo.with_search_path(["prog", "-cn", "mine", "--info", "defaults", "a=1"]) == \
        ["prog", "-cn", "mine", "--info", "defaults", sp, "a=1"]
    assert main_ppo.with_search_path(["prog", "--cfg", "job"]) == ["prog", "--cfg", "job", sp]
    merged = main_ppo.with_search_path(["prog", "hydra.searchpath=[file:///x]"])
    assert merged == ["prog", "hydra.searchpath=[file:///x,pkg://rlpost.trainer.config]"]
    same = ["prog", "hydra.searchpath=[pkg://rlpost.trainer.config]"]
    assert main_ppo.with_search_path(list(same)) == same


def _compose(*overrides: str):
    with initialize_config_dir(str(CONFIG_DIR), version_base=None):
        return compose("ppo_trainer", overrides=list(overrides))


def test_config_error_exits_2_with_one_line(capsys):
    status = main_ppo.run(_compose("data.train_batch_size=7"))
    err = capsys.readouterr().err
    assert status == 2
    assert err.startswith("config error: data.train_batch_size=7") and err.count("\n") == 1


def test_dry_run_prints_plan(capsys):
    status = main_ppo.run(_compose("trainer.dry_run=true", "trainer.n_gpus_per_node=2",
                                   "actor_rollout_ref.rollout.tensor_model_parallel_size=1"))
    out = capsys.readouterr().out
    assert status == 0 and "rlpost dry run" in out and "roles: actor_rollout, critic" in out


@pytest.mark.timeout(120)
def test_user_yaml_dry_run_subprocess(tmp_path):
    data = tmp_path / "train.parquet"
    pd.DataFrame({"prompt": ["p"] * 40}).to_parquet(data)
    cmd = [sys.executable, "-m", "rlpost.trainer.main_ppo", f"--config-path={REPO / 'examples' / 'user_yaml'}",
           "--config-name=my_grpo", "trainer.dry_run=true", f"data.train_files={data}", "data.train_batch_size=8",
           "actor_rollout_ref.actor.ppo_micro_batch_size=8", f"hydra.run.dir={tmp_path / 'out'}"]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=110)
    assert proc.returncode == 0, proc.stderr
    assert "per step: 8 prompts -> 32 responses" in proc.stdout
    assert "4 micro-batches of 4" in proc.stdout  # global 8 over 2 devices -> 4 per device
    assert "total training steps: 10 = 40 rows" in proc.stdout  # 40 // 8 x 2 epochs
    assert "config warning: actor_rollout_ref.actor.ppo_micro_batch_size=8 is deprecated" in proc.stderr


def test_a_hydra_flag_after_the_overrides_works():
    proc = subprocess.run([sys.executable, "-m", "rlpost.trainer.main_ppo", "data.train_batch_size=16", "--cfg", "job"],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "unrecognized arguments" not in proc.stderr
    assert "train_batch_size: 16" in proc.stdout  # Hydra printed the composed job config
