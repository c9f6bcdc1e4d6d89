"""Bad input stops `main_ppo` before Ray starts, with one message naming the key or file (exit status 2)."""

from hydra import compose, initialize_config_dir

import rlpost.trainer.config as config_pkg
from rlpost.trainer.main_ppo import run

CONFIG_DIR = config_pkg.__path__[0]
BASE = ["trainer.device=cpu", "trainer.n_gpus_per_node=2", "actor_rollout_ref.rollout.tensor_model_parallel_size=1"]


def _run(overrides):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        return run(compose("ppo_trainer", overrides=BASE + overrides))


def test_missing_model_folder_names_the_key(capsys):
    assert _run(["actor_rollout_ref.model.path=/no/such/model"]) == 2
    err = capsys.readouterr().err
    assert "actor_rollout_ref.model.path='/no/such/model'" in err and "scripts/make_tiny_model.py" in err


def test_missing_data_file_names_the_file(capsys, tiny_model_dir):
    assert _run([f"actor_rollout_ref.model.path={tiny_model_dir}", "data.train_files=/no/such/train.parquet"]) == 2
    assert "/no/such/train.parquet" in capsys.readouterr().err


def test_raising_reward_function_stops_start_up(capsys, tiny_model_dir, tmp_path):
    import subprocess
    import sys

    subprocess.run([sys.executable, "examples/data_preprocess/arith.py", "--local_dir", str(tmp_path),
                    "--train_size", "8", "--test_size", "4"], check=True, capture_output=True)
    reward = tmp_path / "bad_reward.py"
    reward.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                      "    raise RuntimeError('broken scorer')\n")
    status = _run([f"actor_rollout_ref.model.path={tiny_model_dir}", f"data.train_files={tmp_path / 'train.parquet'}",
                   f"data.val_files={tmp_path / 'test.parquet'}", f"custom_reward_function.path={reward}",
                   "data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
                   "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2", "algorithm.adv_estimator=grpo",
                   "actor_rollout_ref.rollout.n=2"])
    err = capsys.readouterr().err
    assert status == 2
    assert "broken scorer" in err and "rlpost/arith" in err
