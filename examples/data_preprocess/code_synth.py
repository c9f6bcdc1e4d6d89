"""Synthetic code task: "Write a Python program that reads N and prints <f(N)>." with hidden stdin/stdout tests.

Writes, in verl's RL format (`prompt` chat messages, `data_source`, `reward_model.ground_truth` = the JSON test
cases `{"inputs": [...], "outputs": [...]}` as codecontests / APPS rows carry them, `extra_info`):
  <local_dir>/train.parquet, <local_dir>/test.parquet

    python examples/data_preprocess/code_synth.py --local_dir ~/data/code --train_size 256 --test_size 32

Scored by running the program in the sandbox (`reward_model.sandbox_fusion.url=local`): the pass fraction of
its test cases. `--data_source` picks the scorer's data source (codecontests, apps, taco, ... or rlpost/code).
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

TASKS = {  # name: (what to print, reference solution body over n)
    "digit_sum": ("the sum of the digits of N", "sum(int(d) for d in str(n))"),
    "double": ("2 * N", "2 * n"),
    "square": ("N * N", "n * n"),
    "plus_one": ("N + 1", "n + 1"),
    "mod_seven": ("N modulo 7", "n % 7"),
    "reverse": ("the digits of N in reverse order", "int(str(n)[::-1])"),
}


def prompt(task: str) -> str:
    return (f"Write a Python program that reads an integer N from standard input and prints {TASKS[task][0]}. "
            "Answer with the program in a ```python code block.")


def reference(task: str) -> str:
    """A correct program (the SFT teacher's when it is right)."""
    return f"n = int(input())\nprint({TASKS[task][1]})\n"


def tests_for(task: str, rng: random.Random, n_cases: int) -> dict:
    """Hidden cases: N in [0, 9999], outputs from the reference expression."""
    inputs = [rng.randint(0, 9999) for _ in range(n_cases)]
    fn = eval(f"lambda n: {TASKS[task][1]}")  # noqa: S307 - our own constant expressions
    return {"inputs": [f"{n}\n" for n in inputs], "outputs": [f"{fn(n)}\n" for n in inputs]}


def make_rows(n: int, split: str, rng: random.Random, data_source: str, n_cases: int) -> list[dict]:
    rows = []
    names = sorted(TASKS)
    for idx in range(n):
        task = names[idx % len(names)]
        tests = tests_for(task, rng, n_cases)
        rows.append({"data_source": data_source, "prompt": [{"role": "user", "content": prompt(task)}],
                     "ability": "code",
                     "reward_model": {"style": "rule", "ground_truth": json.dumps(tests)},
                     "extra_info": {"split": split, "index": idx, "task": task}})
    return rows


def generate(local_dir: str, train_size: int = 256, test_size: int = 32, seed: int = 0,
             data_source: str = "codecontests", n_cases: int = 10) -> dict[str, Path]:
    """Write train/test parquet files; return their paths by name."""
    import pandas as pd

    rng = random.Random(seed)
    out = Path(local_dir).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    paths = {"train": out / "train.parquet", "test": out / "test.parquet"}
    pd.DataFrame(make_rows(train_size, "train", rng, data_source, n_cases)).to_parquet(paths["train"])
    pd.DataFrame(make_rows(test_size, "test", rng, data_source, n_cases)).to_parquet(paths["test"])
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--local_dir", default="~/data/code_synth")
    parser.add_argument("--train_size", type=int, default=256)
    parser.add_argument("--test_size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data_source", default="codecontests")
    parser.add_argument("--n_cases", type=int, default=10)
    args = parser.parse_args()
    for name, path in generate(args.local_dir, args.train_size, args.test_size, args.seed, args.data_source,
                               args.n_cases).items():
        print(f"{name}: {path}")


if __name__ == "__main__":
    main()
