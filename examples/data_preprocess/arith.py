"""Synthetic arithmetic task (the quickstart demo): "What is 23 + 45?" -> "#### 68".

Writes, in verl's RL format (`prompt` chat messages, `data_source`, `reward_model`, `extra_info`):
  <local_dir>/train.parquet, <local_dir>/test.parquet
and, for the SFT warm-up (plain text, no chat markup; columns `question`/`answer` = sft_trainer.yaml's
default prompt_key/response_key, and the same text again as `prompt`/`response`):
  <local_dir>/sft_train.parquet, <local_dir>/sft_test.parquet

    python examples/data_preprocess/arith.py --local_dir ~/data/arith --train_size 2000 --test_size 200

Operand pairs of the test split never occur in the train split. The answer is scored by
`rlpost.reward.score.arith` (1.0 for the exact integer after `####`, else 0.0).
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

DATA_SOURCE = "rlpost/arith"
INSTRUCTION = "Answer with #### followed by the number."
OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


def question(a: int, op: str, b: int) -> str:
    """The user message, ~15 tokens with the tiny tokenizer."""
    return f"What is {a} {op} {b}? {INSTRUCTION}"


def sample_problems(n: int, max_operand: int, ops: str, rng: random.Random, exclude: set) -> list[tuple]:
    """`n` distinct (a, op, b) triples not in `exclude`, operands uniform in [0, max_operand]."""
    space = (max_operand + 1) ** 2 * len(ops)
    if n + len(exclude) > space:
        raise ValueError(f"asked for {n} new problems but only {space - len(exclude)} exist "
                         f"with max_operand={max_operand}, ops={ops!r}")
    out: list[tuple] = []
    seen = set(exclude)
    while len(out) < n:
        item = (rng.randint(0, max_operand), rng.choice(ops), rng.randint(0, max_operand))
        if item not in seen:
            seen.add(item)
            out.append(item)
    return out


def make_rows(problems: list[tuple], split: str) -> list[dict]:
    """verl-format rows of the RL dataset."""
    rows = []
    for idx, (a, op, b) in enumerate(problems):
        answer = str(OPS[op](a, b))
        rows.append({
            "data_source": DATA_SOURCE,
            "prompt": [{"role": "user", "content": question(a, op, b)}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": answer},
            "extra_info": {"split": split, "index": idx, "question": question(a, op, b), "answer": f"#### {answer}"},
        })
    return rows


def make_sft_rows(rows: list[dict]) -> list[dict]:
    """SFT rows: the user message text and the target completion, under both column conventions."""
    out = []
    for r in rows:
        q, a = r["extra_info"]["question"], r["extra_info"]["answer"]
        out.append({"question": q, "answer": a, "prompt": q, "response": a, "extra_info": r["extra_info"]})
    return out


def write_parquet(rows: list[dict], path: Path) -> None:
    import pandas as pd

    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_parquet(path)


def generate(local_dir: str, train_size: int = 2000, test_size: int = 200, seed: int = 0,
             max_operand: int = 99, ops: str = "+") -> dict[str, Path]:
    """Write the four parquet files; return their paths by name (train, test, sft_train, sft_test)."""
    bad = set(ops) - set(OPS)
    if bad or not ops:
        raise ValueError(f"--ops must use only {sorted(OPS)}, got {ops!r}")
    rng = random.Random(seed)
    test = sample_problems(test_size, max_operand, ops, rng, exclude=set())
    train = sample_problems(train_size, max_operand, ops, rng, exclude=set(test))
    out = Path(local_dir).expanduser()
    paths = {name: out / f"{name}.parquet" for name in ("train", "test", "sft_train", "sft_test")}
    train_rows, test_rows = make_rows(train, "train"), make_rows(test, "test")
    write_parquet(train_rows, paths["train"])
    write_parquet(test_rows, paths["test"])
    write_parquet(make_sft_rows(train_rows), paths["sft_train"])
    write_parquet(make_sft_rows(test_rows), paths["sft_test"])
    return paths


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--local_dir", default="~/data/arith")
    parser.add_argument("--train_size", type=int, default=2000)
    parser.add_argument("--test_size", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max_operand", type=int, default=99, help="operands are drawn from [0, max_operand]")
    parser.add_argument("--ops", default="+", help="operators to mix, e.g. '+' or '+-'")
    args = parser.parse_args(argv)
    paths = generate(args.local_dir, args.train_size, args.test_size, args.seed, args.max_operand, args.ops)
    for name, path in paths.items():
        print(f"{name}: {path}")


if __name__ == "__main__":
    main()
