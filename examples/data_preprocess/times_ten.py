"""Synthetic "times ten" task with an imperfect teacher (the quickstart demo).

"What is 4712 * 10?" -> "#### 47120". Digits are 1-9, so every answer is a plain integer.

The SFT split imitates an imperfect teacher: a fraction `--sft_slip` of its answers forget the zero
("#### 4712"). A model fine-tuned on it learns both answers and, when the slip is the common one, gives
the wrong one under greedy decoding; the RL reward (the exact product) tells them apart, which is what
the quickstart shows GRPO learning. The RL and held-out splits carry the correct answers.

Writes, in verl's RL format (`prompt` chat messages, `data_source`, `reward_model`, `extra_info`):
  <local_dir>/train.parquet, <local_dir>/test.parquet
and the SFT split (columns `question`/`answer`, sft_trainer.yaml's default prompt_key/response_key):
  <local_dir>/sft_train.parquet

    python examples/data_preprocess/times_ten.py --local_dir ~/data/times_ten --num_digits 4 --sft_slip 0.7

Held-out numbers never occur in the train split. Scored by `rlpost.reward.score.arith` (exact integer).
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

DATA_SOURCE = "rlpost/arith"  # the arithmetic family: scored by the exact-integer rule
INSTRUCTION = "Answer with #### followed by the number."


def question(number: str) -> str:
    return f"What is {number} * 10? {INSTRUCTION}"


def sample_numbers(n: int, num_digits: int, rng: random.Random, exclude: set[str]) -> list[str]:
    """`n` distinct numbers of `num_digits` digits in 1-9, none in `exclude`."""
    if n + len(exclude) > 9**num_digits:
        raise ValueError(f"asked for {n} numbers but only {9**num_digits - len(exclude)} remain "
                         f"with num_digits={num_digits}")
    out, seen = [], set(exclude)
    while len(out) < n:
        number = "".join(rng.choice("123456789") for _ in range(num_digits))
        if number not in seen:
            seen.add(number)
            out.append(number)
    return out


def rl_rows(numbers: list[str], split: str) -> list[dict]:
    return [{
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": question(x)}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": x + "0"},
        "extra_info": {"split": split, "index": i, "number": x},
    } for i, x in enumerate(numbers)]


def sft_rows(numbers: list[str], slip: float, rng: random.Random) -> list[dict]:
    rows = []
    for x in numbers:
        answer = x if rng.random() < slip else x + "0"  # the teacher's slip: the zero forgotten
        rows.append({"question": question(x), "answer": f"#### {answer}",
                     "prompt": question(x), "response": f"#### {answer}"})
    return rows


def generate(local_dir: str, train_size: int = 3000, test_size: int = 200, num_digits: int = 4,
             sft_slip: float = 0.0, seed: int = 0) -> dict[str, Path]:
    """Write train/test (RL) and sft_train parquet files; return their paths by name."""
    import pandas as pd

    if not 0.0 <= sft_slip <= 1.0:
        raise ValueError(f"--sft_slip must be in [0, 1], got {sft_slip}")
    rng = random.Random(seed)
    test = sample_numbers(test_size, num_digits, rng, set())
    train = sample_numbers(train_size, num_digits, rng, set(test))
    out = Path(local_dir).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    paths = {name: out / f"{name}.parquet" for name in ("train", "test", "sft_train")}
    pd.DataFrame(rl_rows(train, "train")).to_parquet(paths["train"])
    pd.DataFrame(rl_rows(test, "test")).to_parquet(paths["test"])
    pd.DataFrame(sft_rows(train, sft_slip, random.Random(seed + 1))).to_parquet(paths["sft_train"])
    return paths


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--local_dir", default="~/data/times_ten")
    p.add_argument("--train_size", type=int, default=3000)
    p.add_argument("--test_size", type=int, default=200)
    p.add_argument("--num_digits", type=int, default=4)
    p.add_argument("--sft_slip", type=float, default=0.0, help="fraction of SFT answers that forget the zero")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    for name, path in generate(a.local_dir, a.train_size, a.test_size, a.num_digits, a.sft_slip, a.seed).items():
        print(f"{name}: {path}")


if __name__ == "__main__":
    main()
