"""main_eval: per-data-source mean score and pass@n over saved generations, end to end via subprocess."""

import json
import subprocess
import sys

import pandas as pd
import pytest
from omegaconf import OmegaConf

from rlpost.trainer.main_eval import evaluate, summarize


def write_generations(path):
    rows = [
        {"data_source": "rlpost/arith", "reward_model": {"ground_truth": "5"}, "responses": ["#### 5", "#### 4"]},
        {"data_source": "rlpost/arith", "reward_model": {"ground_truth": "7"}, "responses": ["#### 1", "#### 2"]},
        {"data_source": "openai/gsm8k", "reward_model": {"ground_truth": "3"}, "responses": ["#### 3", "#### 3"]},
    ]
    pd.DataFrame(rows).to_parquet(path)


def test_summarize():
    metrics = summarize(["a", "a", "b"], [[1.0, 0.0], [0.0, 0.0], [1.0]])
    assert metrics == {"test_score/a": 0.25, "pass@2/a": 0.5, "test_score/b": 1.0}


@pytest.mark.timeout(120)
def test_main_eval_subprocess(tmp_path):
    data = tmp_path / "gen.parquet"
    write_generations(data)
    out = tmp_path / "metrics.json"
    proc = subprocess.run(
        [sys.executable, "-m", "rlpost.trainer.main_eval", f"data.path={data}", "ray_init.num_cpus=2",
         f"output_path={out}", f"hydra.run.dir={tmp_path / 'hydra'}"],
        capture_output=True, text=True, timeout=100,
    )
    assert proc.returncode == 0, proc.stderr
    expected = {"test_score/openai/gsm8k": 1.0, "pass@2/openai/gsm8k": 1.0,
                "test_score/rlpost/arith": 0.25, "pass@2/rlpost/arith": 0.5}
    assert json.loads(out.read_text()) == expected
    assert '"test_score/rlpost/arith": 0.25' in proc.stdout


def test_custom_function_and_errors(tmp_path):
    data = tmp_path / "gen.parquet"
    write_generations(data)
    fn = tmp_path / "score.py"
    fn.write_text("def by_len(data_source, solution_str, ground_truth, extra_info=None):\n"
                  "    return len(solution_str) / 10\n")
    cfg = OmegaConf.create({
        "data": {"path": str(data), "response_key": "responses", "data_source_key": "data_source",
                 "reward_model_key": "reward_model"},
        "custom_reward_function": {"path": str(fn), "name": "by_len", "reward_kwargs": {}},
        "ray_init": {"num_cpus": 1},
    })
    assert evaluate(cfg)["test_score/openai/gsm8k"] == pytest.approx(0.6)
    cfg.data.response_key = "outputs"
    with pytest.raises(KeyError, match=r"data.response_key: column 'outputs' not in .*available columns"):
        evaluate(cfg)
    cfg.data.path = str(tmp_path / "missing.parquet")
    with pytest.raises(FileNotFoundError, match="data.path: file not found"):
        evaluate(cfg)
