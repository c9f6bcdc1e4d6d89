"""Synthetic visual task with an imperfect teacher: "Which colour is the square?" -> "#### blue"; the answer is
only in the picture (the question text is the same on every row).

Writes, in verl's multi-modal RL format (`prompt` with an `<image>` placeholder, `images` = [{"bytes": PNG}],
`data_source`, `reward_model`, `extra_info`):
  <local_dir>/train.parquet       RL prompts (data_source rlpost/colour)
  <local_dir>/test.parquet        held-out pictures, never a train picture (rlpost/colour), then the same rows
                                  with every picture blanked to white (rlpost/colour_blank): the control that
                                  shows the answers come from the pixels (validated under its own metric)
  <local_dir>/sft_train.parquet   the teacher's demonstrations (`prompt`, `response`, `images`)
  <local_dir>/corpus.txt          the prompt and answer text, for the tokenizer of scripts/make_tiny_model.py

    python examples/data_preprocess/vision_colour.py --local_dir ~/data/colour --sft_slip 0.6

Pictures are 56x56 px (4 vision tokens with the tiny Qwen2-VL processor): one filled square of side 28 to 48 px
at a random place on white, in one of COLOURS. The teacher names the next colour of COLOURS instead of the right
one in a fraction `--sft_slip` of its answers, so a model fine-tuned on it says the wrong colour under greedy
decoding while still giving the right one some probability: what RL can find. Scored by
`rlpost.reward.score.colour` (exact colour name after `####`).
"""

from __future__ import annotations

import argparse
import io
import random
from pathlib import Path

DATA_SOURCE = "rlpost/colour"
BLANK_DATA_SOURCE = "rlpost/colour_blank"
QUESTION = "<image>Which colour is the square? Answer with #### followed by the colour."
COLOURS = {"red": (220, 30, 30), "green": (30, 170, 40), "blue": (30, 60, 220), "yellow": (235, 210, 20)}
SIZE = 56
MIN_SIDE = 42  # squares of 42 to 56 px: the colour covers most patches (1240 distinct scenes per colour)


def picture(colour: str | None, x: int = 0, y: int = 0, side: int = 0) -> bytes:
    """PNG bytes of a white SIZE x SIZE picture with a `colour` square (none when `colour` is None)."""
    from PIL import Image, ImageDraw

    img = Image.new("RGB", (SIZE, SIZE), "white")
    if colour is not None:
        ImageDraw.Draw(img).rectangle([x, y, x + side - 1, y + side - 1], fill=COLOURS[colour])
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def scenes(n: int, rng: random.Random, seen: set) -> list[tuple[str, int, int, int]]:
    """`n` distinct (colour, x, y, side) not in `seen` (added to it), the colours in turn (balanced)."""
    names, out = list(COLOURS), []
    while len(out) < n:
        side = rng.randint(MIN_SIDE, SIZE)
        scene = (names[len(out) % len(names)], rng.randint(0, SIZE - side), rng.randint(0, SIZE - side), side)
        if scene not in seen:
            seen.add(scene)
            out.append(scene)
    return out


def rl_rows(scenes_: list, split: str, blank: bool = False) -> list[dict]:
    return [{"data_source": BLANK_DATA_SOURCE if blank else DATA_SOURCE,
             "prompt": [{"role": "user", "content": QUESTION}],
             "images": [{"bytes": picture(None) if blank else picture(*s)}],
             "ability": "vision",
             "reward_model": {"style": "rule", "ground_truth": s[0]},
             "extra_info": {"index": i, "split": split}} for i, s in enumerate(scenes_)]


def sft_rows(scenes_: list, slip: float, rng: random.Random) -> list[dict]:
    names = list(COLOURS)
    rows = []
    for s in scenes_:
        answer = names[(names.index(s[0]) + 1) % len(names)] if rng.random() < slip else s[0]  # the teacher's slip
        rows.append({"prompt": QUESTION, "response": f"#### {answer}", "images": [{"bytes": picture(*s)}]})
    return rows


def generate(local_dir: str, train_size: int = 512, test_size: int = 64, sft_size: int = 512,
             sft_slip: float = 0.6, seed: int = 0) -> dict[str, Path]:
    """Write the parquet files and the corpus; return their paths by name."""
    import pandas as pd

    if not 0.0 <= sft_slip <= 1.0:
        raise ValueError(f"--sft_slip must be in [0, 1], got {sft_slip}")
    rng, seen = random.Random(seed), set()
    test = scenes(test_size, rng, seen)
    train = scenes(train_size, rng, seen)
    sft = scenes(sft_size, rng, seen)
    out = Path(local_dir).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    paths = {n: out / f"{n}.parquet" for n in ("train", "test", "sft_train")}
    pd.DataFrame(rl_rows(train, "train")).to_parquet(paths["train"])
    pd.DataFrame(rl_rows(test, "test") + rl_rows(test, "test", blank=True)).to_parquet(paths["test"])
    pd.DataFrame(sft_rows(sft, sft_slip, rng)).to_parquet(paths["sft_train"])
    paths["corpus"] = out / "corpus.txt"
    paths["corpus"].write_text("\n".join([QUESTION.replace("<image>", "")] + [f"#### {c}" for c in COLOURS]) + "\n")
    return paths


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--local_dir", required=True)
    p.add_argument("--train_size", type=int, default=512)
    p.add_argument("--test_size", type=int, default=64)
    p.add_argument("--sft_size", type=int, default=512)
    p.add_argument("--sft_slip", type=float, default=0.6, help="share of the teacher's answers naming the next colour")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    paths = generate(a.local_dir, a.train_size, a.test_size, a.sft_size, a.sft_slip, a.seed)
    print(f"wrote {a.train_size} train, {a.test_size} test (+ blanked) and {a.sft_size} SFT rows to "
          f"{paths['train'].parent}")


if __name__ == "__main__":
    main()
