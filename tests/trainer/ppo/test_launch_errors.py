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
    assert _run([f"actor_rollout_ref.model.path={tiny_model_dir}", f"critic.model.path={tiny_model_dir}",
                 "data.train_files=/no/such/train.parquet"]) == 2
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


def test_missing_critic_model_names_critic_model_path(capsys, tiny_model_dir):
    assert _run([f"actor_rollout_ref.model.path={tiny_model_dir}", "algorithm.adv_estimator=gae",
                 "critic.model.path=/no/such/critic"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: critic.model.path='/no/such/critic' is not a local folder"), err


def test_missing_train_files_names_the_key(capsys, tiny_model_dir):
    # the YAML default path does not exist
    assert _run([f"actor_rollout_ref.model.path={tiny_model_dir}", f"critic.model.path={tiny_model_dir}"]) == 2
    assert "data.train_files: file not found: '~/data/rlhf/gsm8k/train.parquet'" in capsys.readouterr().err


def test_more_worker_processes_than_cpus_fails_before_ray(capsys, tiny_model_dir):
    from rlpost.trainer.ppo.launch import InputError, run_ppo

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        cfg = compose("ppo_trainer", overrides=BASE + ["trainer.n_gpus_per_node=64", "ray_init.num_cpus=3",
                                                       "data.train_batch_size=64",
                                                       "actor_rollout_ref.actor.ppo_mini_batch_size=64",
                                                       "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
                                                       "critic.ppo_micro_batch_size_per_gpu=1"])
    try:
        run_ppo(cfg)
    except InputError as err:
        assert str(err) == ("trainer.n_gpus_per_node=64 CPU worker processes (trainer.device=cpu), but Ray has 3 "
                            "CPU(s) (ray_init.num_cpus or the machine's); use trainer.n_gpus_per_node=3")
    else:
        raise AssertionError("run_ppo started with 64 workers on 3 CPUs")


def test_empty_training_file_says_so(capsys, tiny_model_dir, tmp_path):
    import pandas as pd

    empty = tmp_path / "empty.parquet"
    pd.DataFrame({"prompt": pd.Series([], dtype=object), "data_source": pd.Series([], dtype=object)}).to_parquet(empty)
    assert _run([f"actor_rollout_ref.model.path={tiny_model_dir}", f"critic.model.path={tiny_model_dir}",
                 f"data.train_files={empty}", "data.val_files=null"]) == 2
    assert f"data.train_files={empty}: no training rows" in capsys.readouterr().err


# --- multi-turn rollouts: YAML entries and the names in the data are checked over the whole data set ---------
MULTI_TURN = ["actor_rollout_ref.rollout.multi_turn.enable=true", "actor_rollout_ref.rollout.name=vllm",
              "data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
              "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2", "data.max_prompt_length=1024",
              "algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=2"]
CALCULATOR = "tools:\n  - class_name: rlpost.tools.calculator_tool.CalculatorTool\n    config: {type: native}\n"


def _multi_turn_data(tmp_path, agent_names, interaction=None):
    import pandas as pd

    rows = [{"data_source": "rlpost/arith", "prompt": [{"role": "user", "content": f"What is {i} * 3?"}],
             "reward_model": {"style": "rule", "ground_truth": str(3 * i)}, "agent_name": name,
             "extra_info": {"index": i, "interaction_kwargs": {"name": interaction or "none", "ground_truth": "3"}}
             if interaction else {"index": i}} for i, name in enumerate(agent_names)]
    pd.DataFrame(rows).to_parquet(tmp_path / "train.parquet")
    return [f"data.train_files={tmp_path / 'train.parquet'}", "data.val_files=null"]


def _tools_yaml(tmp_path, text=CALCULATOR):
    path = tmp_path / "tools.yaml"
    path.write_text(text)
    return f"actor_rollout_ref.rollout.multi_turn.tool_config_path={path}"


def test_unregistered_agent_name_lists_the_registered_ones(capsys, tiny_model_dir, tmp_path):
    data = _multi_turn_data(tmp_path, ["tool_agent", "tool_agent", "my_agent", "tool_agent"])
    status = _run([f"actor_rollout_ref.model.path={tiny_model_dir}", *MULTI_TURN, *data, _tools_yaml(tmp_path)])
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1, err
    # The registry is the process's: it lists the built-in loops and any a test before this one registered.
    from rlpost.agent.base import AGENT_LOOPS

    assert err.startswith(f"error: data.train_files={tmp_path / 'train.parquet'}: agent_name values ['my_agent'] "
                          f"are not registered agent loops; registered: {AGENT_LOOPS.names()}"), err
    assert {"external_agent", "single_turn_agent", "tool_agent"} <= set(AGENT_LOOPS.names())


def test_unknown_tool_class_and_bad_schema_name_the_yaml_entry(capsys, tiny_model_dir, tmp_path):
    data = _multi_turn_data(tmp_path, ["tool_agent"] * 4)
    bad_class = CALCULATOR + "  - class_name: my_pkg.tools.Nope\n    config: {type: native}\n"
    status = _run([f"actor_rollout_ref.model.path={tiny_model_dir}", *MULTI_TURN, *data,
                   _tools_yaml(tmp_path, bad_class)])
    err = capsys.readouterr().err
    assert status == 2 and f"{tmp_path / 'tools.yaml'}: tools[1] (class_name 'my_pkg.tools.Nope'): unknown tool " \
                          "class" in err, err
    bad_schema = CALCULATOR + "    tool_schema: {type: func, function: {name: calculator}}\n"
    status = _run([f"actor_rollout_ref.model.path={tiny_model_dir}", *MULTI_TURN, *data,
                   _tools_yaml(tmp_path, bad_schema)])
    err = capsys.readouterr().err
    assert status == 2 and "tools.yaml: tools[0]" in err and "bad tool_schema" in err, err


def test_unknown_interaction_name_stops_start_up(capsys, tiny_model_dir, tmp_path):
    data = _multi_turn_data(tmp_path, ["tool_agent"] * 4, interaction="gsm8kk")
    interactions = tmp_path / "interaction.yaml"
    interactions.write_text("interaction:\n  - name: gsm8k\n    class_name: "
                            "rlpost.interactions.gsm8k_interaction.Gsm8kInteraction\n    config: {}\n")
    status = _run([f"actor_rollout_ref.model.path={tiny_model_dir}", *MULTI_TURN, *data,
                   f"actor_rollout_ref.rollout.multi_turn.interaction_config_path={interactions}"])
    err = capsys.readouterr().err
    assert status == 2 and "interaction_kwargs.name values ['gsm8kk'] are not configured interactions; " \
                          "configured: ['gsm8k']" in err, err


def test_a_second_run_on_a_folder_in_use_stops_before_ray(capsys, tiny_model_dir, tmp_path):
    import subprocess
    import sys

    subprocess.run([sys.executable, "examples/data_preprocess/arith.py", "--local_dir", str(tmp_path),
                    "--train_size", "8", "--test_size", "4"], check=True, capture_output=True)
    run_dir = tmp_path / "run"
    hold = ("import sys, time\nfrom rlpost.utils.run_lock import run_lock\n"
            "with run_lock(sys.argv[1]):\n    print('held', flush=True)\n    time.sleep(60)\n")
    first = subprocess.Popen([sys.executable, "-c", hold, str(run_dir)], stdout=subprocess.PIPE, text=True)
    try:
        assert first.stdout.readline().strip() == "held"
        status = _run([f"actor_rollout_ref.model.path={tiny_model_dir}", f"data.train_files={tmp_path / 'train.parquet'}",
                       "data.val_files=null", "data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
                       "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2", "algorithm.adv_estimator=grpo",
                       "actor_rollout_ref.rollout.n=2", f"trainer.default_local_dir={run_dir}"])
    finally:
        first.kill()
        first.wait()
    out = capsys.readouterr()
    assert status == 2
    assert out.err.startswith(f"error: trainer.default_local_dir={str(run_dir)!r} is in use by another run (pid "
                              f"{first.pid} on "), out.err
    assert "engine and Ray logs" not in out.out  # stopped before Ray


def test_unusable_code_test_cases_stop_start_up_naming_file_and_row(capsys, tiny_model_dir, tmp_path):
    import json

    import pandas as pd

    good = json.dumps({"inputs": ["1\n"], "outputs": ["1\n"]})
    rows = [{"data_source": "codecontests", "prompt": [{"role": "user", "content": f"Write program {i}"}],
             "reward_model": {"style": "rule", "ground_truth": good if i != 5 else '{"inputs": ["1\\n"]}'},
             "extra_info": {"index": i}} for i in range(8)]
    pd.DataFrame(rows).to_parquet(tmp_path / "code.parquet")
    status = _run([f"actor_rollout_ref.model.path={tiny_model_dir}", f"data.train_files={tmp_path / 'code.parquet'}",
                   "data.val_files=null", "data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
                   "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2", "algorithm.adv_estimator=grpo",
                   "actor_rollout_ref.rollout.n=2"])
    err = capsys.readouterr().err
    assert status == 2
    assert (f"data.train_files: {tmp_path / 'code.parquet'} row 5 (data_source='codecontests'): "
            "reward_model.ground_truth has no 'outputs'") in err, err
