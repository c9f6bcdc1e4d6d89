"""Training data that cannot train right stops `main_ppo` before Ray starts (exit status 2), naming the file,
row and column, with the fix: rows without the ground truth a rule-based reward needs, and an over-long
prompt with data.truncation=error (found at start, not when its batch is drawn)."""

import subprocess
import sys

import pandas as pd
import pytest
from hydra import compose, initialize_config_dir

import rlpost.trainer.config as config_pkg
from rlpost.trainer.main_ppo import run

CONFIG_DIR = config_pkg.__path__[0]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("preflight_data")
    subprocess.run([sys.executable, "examples/data_preprocess/arith.py", "--local_dir", str(root),
                    "--train_size", "8", "--test_size", "4"], check=True, capture_output=True)
    return root


def _run(model: str, train: str, val: str, *extra: str) -> int:
    overrides = ["trainer.device=cpu", "trainer.n_gpus_per_node=2", "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
                 f"actor_rollout_ref.model.path={model}", f"data.train_files={train}", f"data.val_files={val}",
                 "data.train_batch_size=4", "data.max_prompt_length=32", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
                 "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2", "algorithm.adv_estimator=grpo",
                 "actor_rollout_ref.rollout.n=2", *extra]
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        return run(compose("ppo_trainer", overrides=overrides))


@pytest.mark.timeout(120)
def test_training_rows_without_ground_truth_stop_start_up(data, tiny_model_dir, tmp_path, capsys):
    train = tmp_path / "no_reward_model.parquet"
    pd.read_parquet(data / "train.parquet").drop(columns=["reward_model"]).to_parquet(train)
    assert _run(tiny_model_dir, str(train), str(data / "test.parquet")) == 2  # validation rows are fine
    err = capsys.readouterr().err
    assert f"data.train_files: {train} row 0 has no column 'reward_model' (8 of 8 rows lack" in err
    assert "reward_model.ground_truth" in err and "custom_reward_function.path" in err


@pytest.mark.timeout(120)
def test_custom_reward_without_ground_truth_only_warns(caplog):
    from rlpost.reward.preflight import check_ground_truth

    rows = [{"reward_model": {"style": "rule"}}, {"reward_model": {"ground_truth": "3"}}]
    check_ground_truth(type("DS", (), {"rows": rows})(), "data.train_files", required=False)
    assert "data.train_files: row 0 has no 'ground_truth' (1 of 2 rows" in caplog.text
    assert "custom_reward_function.path is set: continuing" in caplog.text


@pytest.mark.timeout(120)
def test_overlong_training_prompt_found_at_start(data, tiny_model_dir, tmp_path, capsys):
    frame = pd.read_parquet(data / "train.parquet")
    long_row = frame.iloc[[5]].copy()
    long_row.at[long_row.index[0], "prompt"] = [{"role": "user", "content": "What is 1 + 2? " * 20}]
    train = tmp_path / "overlong.parquet"
    pd.concat([frame.iloc[:5], long_row, frame.iloc[6:]], ignore_index=True).to_parquet(train)
    assert _run(tiny_model_dir, str(train), str(data / "test.parquet")) == 2
    err = capsys.readouterr().err
    assert f"{train} row 5: prompt is " in err and "longer than data.max_prompt_length=32" in err
    assert "1 of 8 prompts are over" in err
    assert "data.filter_overlong_prompts=true" in err and "data.truncation=left" in err
    longest = int(err.split("the longest ")[1].split(" ")[0])
    assert f"Set data.max_prompt_length={longest}," in err and longest > 32
