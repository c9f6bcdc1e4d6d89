"""Convert a local copy of GSM8K (HF layout) into verl's RL format. Nothing is downloaded.

Input: `<local_dir>/main/train-*.parquet` and `<local_dir>/main/test-*.parquet` (or `*.jsonl`), with
columns `question` and `answer` (the answer ends with `#### <number>`).
Output: `<output_dir>/train.parquet`, `<output_dir>/test.parquet` (default output_dir = local_dir).

    python examples/data_preprocess/gsm8k.py --local_dir ~/data/gsm8k_raw --output_dir ~/data/gsm8k
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

DATA_SOURCE = "openai/gsm8k"
INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
_FINAL = re.compile(r"####\s*(-?[0-9.,]+)")


def extract_answer(answer: str) -> str:
    """The number after `####` in a GSM8K reference answer, commas removed."""
    match = _FINAL.search(answer)
    if match is None:
        raise ValueError(f"GSM8K answer without '#### <number>': {answer[-80:]!r}")
    return match.group(1).replace(",", "").rstrip(".")


def find_split_files(local_dir: Path, split: str) -> list[Path]:
    """`main/<split>-*.parquet`, else `main/<split>*.jsonl` (also without the `main/` folder)."""
    for folder in (local_dir / "main", local_dir):
        for pattern in (f"{split}-*.parquet", f"{split}*.jsonl"):
            files = sorted(folder.glob(pattern))
            if files:
                return files
    raise FileNotFoundError(f"no GSM8K {split} files under {local_dir} (looked for main/{split}-*.parquet "
                            f"and main/{split}*.jsonl)")


def load_split(local_dir: Path, split: str):
    import pandas as pd

    files = find_split_files(local_dir, split)
    frames = [pd.read_parquet(f) if f.suffix == ".parquet" else pd.read_json(f, lines=True) for f in files]
    return pd.concat(frames, ignore_index=True)


def convert_rows(frame, split: str) -> list[dict]:
    """verl-format rows from a frame with `question` / `answer` columns."""
    missing = {"question", "answer"} - set(frame.columns)
    if missing:
        raise KeyError(f"GSM8K {split}: columns {sorted(missing)} missing; available: {list(frame.columns)}")
    rows = []
    for idx, (q, a) in enumerate(zip(frame["question"], frame["answer"])):
        rows.append({
            "data_source": DATA_SOURCE,
            "prompt": [{"role": "user", "content": f"{q} {INSTRUCTION}"}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": extract_answer(a)},
            "extra_info": {"split": split, "index": idx, "question": q, "answer": a},
        })
    return rows


def convert(local_dir: str, output_dir: str | None = None) -> dict[str, Path]:
    """Convert both splits; return the written paths by split name."""
    import pandas as pd

    src = Path(local_dir).expanduser()
    dst = Path(output_dir).expanduser() if output_dir else src
    dst.mkdir(parents=True, exist_ok=True)
    paths = {}
    for split in ("train", "test"):
        paths[split] = dst / f"{split}.parquet"
        pd.DataFrame(convert_rows(load_split(src, split), split)).to_parquet(paths[split])
    return paths


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--local_dir", required=True, help="folder holding the HF GSM8K files")
    parser.add_argument("--output_dir", default=None, help="where train/test.parquet go (default: local_dir)")
    args = parser.parse_args(argv)
    for split, path in convert(args.local_dir, args.output_dir).items():
        print(f"{split}: {path}")


if __name__ == "__main__":
    main()
