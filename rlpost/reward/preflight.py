"""Check the reward function and the ground truth it needs, on the data, before any worker starts."""

from __future__ import annotations

import logging
import time
from typing import Any

from rlpost import keys
from rlpost.reward import base

logger = logging.getLogger(__name__)
CHECK_BUDGET_S = 10.0  # start-up time a slow reward function may take in this check


def check_reward_fn(
    reward_fn: Any,
    dataset: Any,
    n: int = 4,
    reward_fn_key: str = keys.DATA_SOURCE,
    budget_s: float = CHECK_BUDGET_S,
) -> list[float]:
    """Score `n` rows spread over `dataset` (first and last included), using each row's ground truth as the
    response text.

    The point is not the score but to fail early (before Ray and the models start) on an unknown
    data source, a function that raises, or a non-finite score; a plain function is tried on every chosen
    row (within `budget_s` seconds) so the error says how many of them failed.

    Args:
        reward_fn: a reward manager (from `load_reward_manager`; its own scoring path is used, so
            `batch`/`prime` functions are checked as they will be called) or a plain
            `compute_score(data_source, solution_str, ground_truth, extra_info=None)`.
        dataset: indexable; items are dicts with `reward_fn_key`, `reward_model`, `extra_info`.
        n: number of rows checked.
        budget_s: a slow plain function stops being tried after this many seconds (at least one row).

    Returns:
        The scores of the checked rows.

    Raises:
        RewardFunctionError: naming the data source and row of the first failure, and the failure count.
    """
    samples = [_check_sample(dataset[i], i, getattr(reward_fn, "reward_fn_key", reward_fn_key))
               for i in _spread(len(dataset), n)]
    if hasattr(reward_fn, "score_samples"):
        results = reward_fn.score_samples(samples)
        return [base.split_result(r, s)[0] for r, s in zip(results, samples)]
    scores, failures, start = [], [], time.perf_counter()
    for sample in samples:
        try:
            scores.append(base.split_result(base.call_reward_fn(reward_fn, sample), sample)[0])
        except base.RewardFunctionError as err:
            failures.append(err)
        if time.perf_counter() - start > budget_s:
            break
    if failures:
        first = failures[0]
        raise base.RewardFunctionError(
            first.data_source, first.index,
            f"{first.reason} (failed on {len(failures)} of {len(scores) + len(failures)} rows tried)",
            first.traceback_str)
    return scores


def _spread(rows: int, n: int) -> list[int]:
    """Up to `n` row indices evenly spread over `rows` rows, first and last included."""
    if rows <= n:
        return list(range(rows))
    return sorted({round(i * (rows - 1) / max(n - 1, 1)) for i in range(n)})


def _check_sample(row: Any, index: int, reward_fn_key: str) -> base.Sample:
    ground_truth = (row.get(keys.REWARD_MODEL) or {}).get("ground_truth")
    return base.Sample(
        index=index,
        data_source=row.get(reward_fn_key),
        prompt_str="",
        # Satisfies the built-in scorers' formats (boxed, ####); only errors matter here.
        response_str=f"\\boxed{{{ground_truth}}}\n#### {ground_truth}",
        ground_truth=ground_truth,
        extra_info=row.get(keys.EXTRA_INFO),
        valid_response_length=0,
    )


def _ground_truth(row: Any) -> Any:
    reward_model = row.get(keys.REWARD_MODEL)
    return reward_model.get("ground_truth") if isinstance(reward_model, dict) else None


def check_ground_truth(dataset: Any, files_key: str, required: bool = True) -> None:
    """Every row of `dataset` has `reward_model.ground_truth`, which rule-based scorers compare against.

    Reads `dataset.rows` (all rows of an `RLHFDataset`, no tokenization), else the first 16 items.

    Args:
        dataset: the training or validation dataset.
        files_key: the config key of its files (`data.train_files`), named in the message.
        required: raise (built-in scorers); False only warns (a custom function may not need it).

    Raises:
        ValueError: naming the key, the file, the first row without it and how many lack it.
    """
    from rlpost.data.rl_dataset import row_origin

    rows = getattr(dataset, "rows", None)
    if rows is None:
        rows = [dataset[i] for i in range(min(len(dataset), 16))]
    missing = [i for i, row in enumerate(rows) if _ground_truth(row) is None]
    if not missing:
        return
    file_rows = getattr(dataset, "file_rows", None)
    where = ("{} row {}".format(*row_origin(file_rows, missing[0])) if file_rows
             else f"row {missing[0]}")
    column = ("has no 'ground_truth'" if keys.REWARD_MODEL in rows[missing[0]]
              else f"has no column {keys.REWARD_MODEL!r}")
    message = (f"{files_key}: {where} {column} ({len(missing)} of {len(rows)} rows lack "
               f"{keys.REWARD_MODEL}.ground_truth); the rule-based reward scores each response against it, so "
               f"every response would be compared with None. Add a column {keys.REWARD_MODEL!r} with "
               f"{{'ground_truth': ...}} per row (see examples/data_preprocess), or set "
               f"custom_reward_function.path to a function that needs none")
    if required:
        raise ValueError(message)
    logger.warning("%s (custom_reward_function.path is set: continuing)", message)


def check_code_tests(dataset: Any, files_key: str, reward_fn_key: str = keys.DATA_SOURCE) -> None:
    """Every row of a code data source (`CODE_DATA_SOURCES`) holds test cases the sandbox scorer can run.

    A row the scorer cannot read would score 0 (`bad_tests`) at every step; the first such row stops the run
    here instead. Reads `dataset.rows` (all rows of an `RLHFDataset`), else the first 16 items.

    Raises:
        ValueError: naming the key, the file and row, what is wrong, how many rows are affected, and a shape
            that works.
    """
    from rlpost.data.rl_dataset import row_origin
    from rlpost.reward.score import CODE_DATA_SOURCES
    from rlpost.reward.score.code import problem_with_tests

    rows = getattr(dataset, "rows", None)
    if rows is None:
        rows = [dataset[i] for i in range(min(len(dataset), 16))]
    bad = [(i, problem) for i, row in enumerate(rows) if row.get(reward_fn_key) in CODE_DATA_SOURCES
           and (problem := problem_with_tests(_ground_truth(row))) is not None]
    if not bad:
        return
    first, problem = bad[0]
    file_rows = getattr(dataset, "file_rows", None)
    where = "{} row {}".format(*row_origin(file_rows, first)) if file_rows else f"row {first}"
    raise ValueError(
        f"{files_key}: {where} ({reward_fn_key}={rows[first].get(reward_fn_key)!r}): "
        f"{keys.REWARD_MODEL}.ground_truth {problem} ({len(bad)} of {len(rows)} rows have unusable test cases); "
        f"the sandbox scorer runs the response on them, so every response would score 0. Use e.g. "
        f"'{{\"inputs\": [\"1 2\\n\"], \"outputs\": [\"3\\n\"]}}' (add \"fn_name\" for call-based tests) or "
        f"'{{\"assert_case\": [\"assert f(1) == 2\"]}}' (docs/sandbox.md, Scorers)")
