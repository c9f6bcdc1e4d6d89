"""Score generated responses offline: `python -m rlpost.trainer.main_eval data.path=gen.parquet`.

Reads a parquet file whose `data.response_key` column holds n response strings per row (e.g. written
by a generation run), scores each with the reward function of the row's data source (built-in
scorers, or `custom_reward_function.path/name`), and prints per data source:
  `test_score/<data_source>`: mean score over all responses,
  `pass@<n>/<data_source>`: fraction of rows with at least one response scoring >= 1.0 (when n > 1).
Scoring runs in a process pool of `ray_init.num_cpus` processes (null: all CPUs); no Ray needed.
`++output_path=metrics.json` also writes the metrics as JSON.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import hydra
import numpy as np
from omegaconf import DictConfig

from rlpost.reward.base import Sample, call_reward_fn, split_result
from rlpost.reward.custom import RewardFnSpec, reward_fn_spec

PASS_THRESHOLD = 1.0  # a response "passes" when its score reaches this (rule scorers give 1.0 if correct)


def _as_list(value: Any) -> list:
    if isinstance(value, np.ndarray):
        return value.tolist()
    return [value] if isinstance(value, str) else list(value)


def score_row(spec: RewardFnSpec, row_index: int, data_source: str, responses: list[str],
              reward_data: Any, extra_info: Any = None) -> list[float]:
    """Scores of one row's responses (runs in a pool worker)."""
    fn = spec.resolve()
    ground_truth = reward_data.get("ground_truth") if isinstance(reward_data, dict) else reward_data
    scores = []
    for text in responses:
        sample = Sample(row_index, data_source, "", text, ground_truth, extra_info, 0)
        scores.append(split_result(call_reward_fn(fn, sample), sample)[0])
    return scores


def summarize(data_sources: list[str], row_scores: list[list[float]]) -> dict[str, float]:
    """Per data source: mean score over rows (each row: mean over its responses), and pass@n."""
    grouped: dict[str, list[list[float]]] = defaultdict(list)
    for source, scores in zip(data_sources, row_scores):
        grouped[source].append(scores)
    metrics: dict[str, float] = {}
    for source, rows in sorted(grouped.items()):
        metrics[f"test_score/{source}"] = float(np.mean([np.mean(r) for r in rows]))
        n = max(len(r) for r in rows)
        if n > 1:
            metrics[f"pass@{n}/{source}"] = float(np.mean([max(r) >= PASS_THRESHOLD for r in rows]))
    return metrics


def evaluate(config: DictConfig) -> dict[str, float]:
    """Load `data.path`, score every response, return the metrics."""
    import pandas as pd

    data_cfg = config.data
    path = os.path.expanduser(str(data_cfg.path))
    if not os.path.isfile(path):
        raise FileNotFoundError(f"data.path: file not found: {path}")
    frame = pd.read_parquet(path)
    columns = {"data.response_key": data_cfg.response_key, "data.data_source_key": data_cfg.data_source_key,
               "data.reward_model_key": data_cfg.reward_model_key}
    for key_name, column in columns.items():
        if column not in frame.columns:
            raise KeyError(f"{key_name}: column {column!r} not in {path}; available columns: {list(frame.columns)}")
    spec = reward_fn_spec(config)
    sources = [str(s) for s in frame[data_cfg.data_source_key]]
    responses = [_as_list(r) for r in frame[data_cfg.response_key]]
    reward_data = list(frame[data_cfg.reward_model_key])
    extra = list(frame["extra_info"]) if "extra_info" in frame.columns else [None] * len(frame)
    workers = config.ray_init.num_cpus or os.cpu_count() or 1
    with ProcessPoolExecutor(max_workers=min(int(workers), max(len(frame), 1))) as pool:
        row_scores = list(pool.map(score_row, [spec] * len(frame), range(len(frame)), sources, responses,
                                   reward_data, extra))
    return summarize(sources, row_scores)


@hydra.main(config_path="config", config_name="evaluation", version_base=None)
def main(config: DictConfig) -> None:
    metrics = evaluate(config)
    print(json.dumps(metrics, indent=2))
    output_path = config.output_path
    if output_path:
        with open(os.path.expanduser(str(output_path)), "w") as f:
            json.dump(metrics, f, indent=2)


if __name__ == "__main__":
    main()
