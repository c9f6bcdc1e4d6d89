"""Synthetic visual task: "How many squares?" on a generated picture -> "#### 3"; the answer is only in the image.

Writes, in verl's multi-modal RL format (`prompt` with an `<image>` placeholder, `images` = [{"bytes": PNG}],
`data_source`, `reward_model`, `extra_info`):
  <local_dir>/train.parquet, <local_dir>/test.parquet

    python examples/data_preprocess/vision_squares.py --local_dir ~/data/squares --train_size 256 --test_size 64

Pictures are 56x56 px (4 vision tokens with the tiny Qwen2-VL processor of `scripts/make_tiny_model.py --arch
qwen2_vl`): 1 to `--max_squares` black 10x10 squares at random free cells of a 4x4 grid. Test pictures never
repeat a train picture. The answer is scored by `rlpost.reward.score.arith` (data_source rlpost/arith).
"""

from __future__ import annotations

import argparse
import io
import random
from pathlib import Path

DATA_SOURCE = "rlpost/arith"
QUESTION = "<image>How many squares? Answer with #### followed by the number."
SIZE, CELL = 56, 14


def picture(cells: tuple[int, ...]) -> bytes:
    """PNG bytes of a white SIZE x SIZE picture with a black square in each of the 4x4 grid `cells`."""
    from PIL import Image, ImageDraw

    img = Image.new("RGB", (SIZE, SIZE), "white")
    draw = ImageDraw.Draw(img)
    for c in cells:
        x, y = CELL * (c % 4) + 2, CELL * (c // 4) + 2
        draw.rectangle([x, y, x + 9, y + 9], fill="black")
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def rows(n: int, max_squares: int, rng: random.Random, seen: set, split: str) -> list[dict]:
    """`n` rows with pictures not in `seen` (added to it)."""
    out = []
    while len(out) < n:
        cells = tuple(sorted(rng.sample(range(16), rng.randint(1, max_squares))))
        if cells in seen:
            continue
        seen.add(cells)
        out.append({"data_source": DATA_SOURCE, "prompt": [{"role": "user", "content": QUESTION}],
                    "images": [{"bytes": picture(cells)}],
                    "reward_model": {"style": "rule", "ground_truth": str(len(cells))},
                    "extra_info": {"index": len(out), "split": split}})
    return out


def main() -> None:
    import pandas as pd

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--local_dir", required=True)
    p.add_argument("--train_size", type=int, default=256)
    p.add_argument("--test_size", type=int, default=64)
    p.add_argument("--max_squares", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    rng, seen = random.Random(a.seed), set()
    out = Path(a.local_dir).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    test = rows(a.test_size, a.max_squares, rng, seen, "test")
    pd.DataFrame(rows(a.train_size, a.max_squares, rng, seen, "train")).to_parquet(out / "train.parquet")
    pd.DataFrame(test).to_parquet(out / "test.parquet")
    print(f"wrote {a.train_size} train and {a.test_size} test rows to {out}")


if __name__ == "__main__":
    main()
