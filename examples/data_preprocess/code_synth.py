"""Synthetic code task: "Write a Python program that reads N and prints <f(N)>." with hidden stdin/stdout tests.

Writes, in verl's RL format (`prompt` chat messages, `data_source`, `reward_model.ground_truth` = the JSON test
cases `{"inputs": [...], "outputs": [...]}` as codecontests / APPS rows carry them, `extra_info`):
  <local_dir>/train.parquet, <local_dir>/test.parquet

    python examples/data_preprocess/code_synth.py --local_dir ~/data/code --train_size 256 --test_size 32

Scored by running the program in the sandbox (`reward_model.sandbox_fusion.url=local`): the pass fraction of
its test cases. `--data_source` picks the scorer's data source (codecontests, apps, taco, ... or rlpost/code).

`--family ops` (the `TASK=code` quickstart): "... prints N times 7." with K in [2, --k_max], the test split's
(operator, K) pairs never in the training split (one operator per K held out in a first round over the K values,
a second in a second round, ...; each held-out K is there with its other operators); also
writes `sft_train.parquet` (columns question/answer and prompt/response) from an imperfect teacher that uses the
wrong operator in a `--sft_slip` fraction of its programs, and `corpus.txt` (the texts, for the tiny model's
tokenizer).
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


OPS = {"plus": "+", "times": "*", "minus": "-", "modulo": "%"}
SLIPS = {"plus": "*", "times": "+", "minus": "+", "modulo": "//"}  # the teacher's usual wrong operator
OPS_SOURCE = "rlpost/code"


def ops_prompt(word: str, k: int) -> str:
    return f"Write a Python program that reads N and prints N {word} {k}."


def ops_program(op: str, k: int) -> str:
    return f"```python\nn = int(input())\nprint(n {op} {k})\n```"


def ops_rows(pairs: list[tuple[str, int]], split: str, rng: random.Random, n_cases: int) -> list[dict]:
    rows = []
    for idx, (word, k) in enumerate(pairs):
        inputs = [rng.randint(0, 999) for _ in range(n_cases)]
        outputs = [eval(f"{n} {OPS[word]} {k}") for n in inputs]  # noqa: S307 - our own constant expressions
        tests = {"inputs": [f"{n}\n" for n in inputs], "outputs": [f"{o}\n" for o in outputs]}
        rows.append({"data_source": OPS_SOURCE, "prompt": [{"role": "user", "content": ops_prompt(word, k)}],
                     "ability": "code", "reward_model": {"style": "rule", "ground_truth": json.dumps(tests)},
                     "extra_info": {"split": split, "index": idx, "op": word, "k": k}})
    return rows


def ops_sft_rows(pairs: list[tuple[str, int]], slip: float, rng: random.Random) -> list[dict]:
    rows = []
    for word, k in pairs:
        program = ops_program(SLIPS[word] if rng.random() < slip else OPS[word], k)
        rows.append({"question": ops_prompt(word, k), "answer": program, "prompt": ops_prompt(word, k),
                     "response": program})
    return rows


def generate_ops(local_dir: str, train_size: int, test_size: int, seed: int, n_cases: int,
                 sft_slip: float, k_max: int = 99) -> dict[str, Path]:
    """The ops family: train/test/sft_train parquet files and corpus.txt; test K values unseen in training."""
    import pandas as pd

    if not 0.0 <= sft_slip <= 1.0:
        raise ValueError(f"--sft_slip must be in [0, 1], got {sft_slip}")
    if k_max < 2:
        raise ValueError(f"--k_max must be at least 2 (K runs from 2 to it), got {k_max}")
    rng = random.Random(seed)
    words = sorted(OPS)
    ks = list(range(2, k_max + 1))
    if not 0 < test_size <= 3 * len(ks):
        raise ValueError(f"--test_size must be in [1, {3 * len(ks)}] for --family ops with --k_max {k_max} "
                         f"(at most 3 held-out operators per K), got {test_size}")
    rng.shuffle(ks)
    # Held out: (operator word, K) pairs, one per K in a first round over the K values, a second operator per K in
    # a second round, ...; each K stays in training with its other words. The model then sees every K copied in
    # SFT, and what the held-out prompts test is the operator the word asks for.
    test = [(words[(i % len(ks) + i // len(ks)) % len(words)], ks[i % len(ks)]) for i in range(test_size)]
    held_out = set(test)
    train_pairs = [(w, k) for w in words for k in range(2, k_max + 1) if (w, k) not in held_out]
    train = [rng.choice(train_pairs) for _ in range(train_size)]
    out = Path(local_dir).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    paths = {name: out / f"{name}.parquet" for name in ("train", "test", "sft_train")}
    pd.DataFrame(ops_rows(train, "train", rng, n_cases)).to_parquet(paths["train"])
    pd.DataFrame(ops_rows(test, "test", rng, n_cases)).to_parquet(paths["test"])
    sft = ops_sft_rows(train, sft_slip, random.Random(seed + 1))
    pd.DataFrame(sft).to_parquet(paths["sft_train"])
    paths["corpus"] = out / "corpus.txt"
    texts = [r["question"] for r in sft] + [ops_program(op, k) for k in range(2, k_max + 1) for op in
                                            (*OPS.values(), "//")]
    paths["corpus"].write_text("\n".join(t.replace("\n", " ") for t in texts) + "\n")
    return paths


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
    parser.add_argument("--family", choices=("fixed", "ops"), default="fixed")
    parser.add_argument("--sft_slip", type=float, default=0.7, help="ops: share of wrong-operator SFT programs")
    parser.add_argument("--k_max", type=int, default=99, help="ops: K runs from 2 to this")
    args = parser.parse_args()
    if args.family == "ops":
        paths = generate_ops(args.local_dir, args.train_size, args.test_size, args.seed, args.n_cases, args.sft_slip,
                             args.k_max)
    else:
        paths = generate(args.local_dir, args.train_size, args.test_size, args.seed, args.data_source, args.n_cases)
    for name, path in paths.items():
        print(f"{name}: {path}")


if __name__ == "__main__":
    main()
