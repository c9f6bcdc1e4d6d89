"""A GSM8K-shaped RL workload: seeded long-tailed prompt lengths and per-sample response caps.

    python -m benchmarks.workload --prompts 64 --n 8 --steps 6 --tokenizer /tmp/m --out /tmp/wl   # parquet

Random-weight models never stop on their own, so the response length of each sample is set by its cap: the
bare limits ask their engine for `max_tokens=cap` per request, and rlpost's runs read the caps from the
dataset (`extra_info.response_caps`, one list of n per prompt; `rlpost.rollout.utils.row_caps`). Both sides
therefore generate, score and train on the same token counts.

Shapes (the defaults, drawn from `numpy.random.default_rng(seed)`):
- prompt: a log-normal length (median 110 tokens, sigma 0.3) redrawn until it lies in [70, 190], the range of
  GSM8K questions under a chat template;
- response: with probability 0.03 a run-away sample that hits the cap; otherwise a log-normal length
  (mu 5.223, sigma 0.55: median 185) clipped to [16, cap]. With cap 1024 the mean is about 240 tokens.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

PROMPT_RANGE = (70, 190)
PROMPT_MEDIAN, PROMPT_SIGMA = 110.0, 0.3
RESPONSE_MU, RESPONSE_SIGMA, RESPONSE_MIN = 5.223, 0.55, 16
RUNAWAY = 0.03
DATA_SOURCE = "openai/gsm8k"  # scored by rlpost's GSM8K rule (a random model scores 0; the time is the point)
_WORDS = ("Natalia sold clips to her friends in April and then half as many in May How many did she sell "
          "altogether Weng earns an hour for babysitting Yesterday she just did minutes of babysitting "
          "Betty is saving money for a new wallet which costs her parents decided to give Julie is reading "
          "a book with pages James writes letter to different friends twice a week Mark has a garden with "
          "flowers He planted plants of three colors apples oranges each box holds dollars cents total").split()


@dataclass(frozen=True)
class Workload:
    """prompt_lens: (P,) prompt tokens; caps: (P, n) response tokens of each sample; cap: the global cap."""

    prompt_lens: np.ndarray
    caps: np.ndarray
    cap: int

    @property
    def n(self) -> int:
        return int(self.caps.shape[1])

    def rows(self) -> list[tuple[int, int]]:
        """(prompt tokens, response tokens) of every sample, prompt-major (the trainer's interleaved order)."""
        return [(int(p), int(r)) for p, caps in zip(self.prompt_lens, self.caps) for r in caps]

    def step(self, k: int, prompts: int) -> Workload:
        """The prompts of training step k (0-based) when each step takes `prompts` rows in file order."""
        sl = slice(k * prompts, (k + 1) * prompts)
        return Workload(self.prompt_lens[sl], self.caps[sl], self.cap)


def gsm8k_shaped(prompts: int, n: int, cap: int = 1024, seed: int = 0) -> Workload:
    """`prompts` prompt lengths and `prompts` x `n` response caps of the module's distributions."""
    if cap < RESPONSE_MIN:
        raise ValueError(f"gsm8k_shaped: cap={cap} is below the shortest response ({RESPONSE_MIN}); use >= 16")
    rng = np.random.default_rng(seed)
    lens = np.empty(prompts, dtype=np.int64)
    for i in range(prompts):
        while True:
            x = int(round(PROMPT_MEDIAN * float(np.exp(PROMPT_SIGMA * rng.standard_normal()))))
            if PROMPT_RANGE[0] <= x <= PROMPT_RANGE[1]:
                lens[i] = x
                break
    body = np.rint(np.exp(RESPONSE_MU + RESPONSE_SIGMA * rng.standard_normal((prompts, n))))
    caps = np.clip(body, RESPONSE_MIN, cap).astype(np.int64)
    caps[rng.random((prompts, n)) < RUNAWAY] = cap
    return Workload(lens, caps, cap)


def token_prompts(workload: Workload, vocab: int, seed: int = 0, low: int = 10) -> list[list[int]]:
    """Random token ids of each prompt's length in [low, vocab) (a random model's input; content is irrelevant)."""
    rng = np.random.default_rng(seed + 1)
    return [rng.integers(low, vocab, int(p)).tolist() for p in workload.prompt_lens]


def render_len(tokenizer: Any, text: str) -> int:
    """Tokens of a one-message user prompt under the tokenizer's chat template (what both trainers feed)."""
    messages = [{"role": "user", "content": text}]
    return len(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                             return_dict=False))


def prompt_text(tokenizer: Any, target: int, rng: np.random.Generator) -> str:
    """A question of GSM8K-like words whose chat-templated form is at most `target` tokens, as close as words
    allow (the dataset's own tokenizer and template: what rlpost's dataset will count)."""
    words = [str(w) if rng.random() > 0.15 else str(int(rng.integers(2, 500))) for w in
             rng.choice(_WORDS, size=4 * target)]
    lo, hi = 1, len(words)
    while lo < hi:  # the longest prefix that fits
        mid = (lo + hi + 1) // 2
        if render_len(tokenizer, " ".join(words[:mid])) <= target:
            lo = mid
        else:
            hi = mid - 1
    return " ".join(words[:lo])


def to_rows(workload: Workload, tokenizer: Any, seed: int = 0) -> list[dict[str, Any]]:
    """verl-format dataset rows (prompt, data_source, reward_model, extra_info with `response_caps`)."""
    rng = np.random.default_rng(seed + 2)
    out = []
    for i, (p, caps) in enumerate(zip(workload.prompt_lens, workload.caps)):
        out.append({"prompt": [{"role": "user", "content": prompt_text(tokenizer, int(p), rng)}],
                    "data_source": DATA_SOURCE, "ability": "math",
                    "reward_model": {"style": "rule", "ground_truth": str(int(rng.integers(1, 1000)))},
                    "extra_info": {"index": i, "response_caps": [int(c) for c in caps]}})
    return out


def write_parquet(workload: Workload, tokenizer: Any, path: Path, seed: int = 0) -> Path:
    """`to_rows` into one parquet file (verl's layout: rlpost's and verl's datasets both read it)."""
    import pandas as pd

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(to_rows(workload, tokenizer, seed)).to_parquet(path)
    return path


def add_arguments(ap: argparse.ArgumentParser, model_dir: bool = True) -> None:
    """The workload's command-line arguments, the same in every benchmark that runs it."""
    if model_dir:
        ap.add_argument("--model-dir", type=Path, required=True, help="the model (its tokenizer counts)")
    ap.add_argument("--prompts", type=int, default=64, help="prompts per step")
    ap.add_argument("--n", type=int, default=8, help="samples per prompt")
    ap.add_argument("--cap", type=int, default=1024, help="the global response cap (data.max_response_length)")
    ap.add_argument("--seed", type=int, default=0)


def main(argv: list[str] | None = None) -> None:
    from transformers import AutoTokenizer

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(ap, model_dir=False)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--tokenizer", type=Path, required=True, help="the model folder whose tokenizer counts")
    ap.add_argument("--out", type=Path, required=True, help="folder: train.parquet (and val.parquet, 1 step)")
    args = ap.parse_args(argv)
    tok = AutoTokenizer.from_pretrained(str(args.tokenizer))
    wl = gsm8k_shaped(args.prompts * args.steps, args.n, args.cap, args.seed)
    write_parquet(wl, tok, args.out / "train.parquet", args.seed)
    write_parquet(wl.step(0, args.prompts), tok, args.out / "val.parquet", args.seed)
    lens = np.array([r for _, r in wl.rows()])
    print(f"[workload] {args.out}: {len(wl.prompt_lens)} prompts x {args.n}; prompt tokens "
          f"{wl.prompt_lens.min()}-{wl.prompt_lens.max()} (median {np.median(wl.prompt_lens):.0f}); response caps "
          f"mean {lens.mean():.0f}, median {np.median(lens):.0f}, {np.mean(lens == args.cap):.1%} at the cap")


def ensure_parquet(prefix: str, tokenizer: Path, prompts: int, n: int, cap: int, seed: int, steps: int) -> Path:
    """The folder `main` writes for these settings, under /tmp/<prefix>_..., written once: every configuration of
    a benchmark on the host reads the same file."""
    data = Path(f"/tmp/{prefix}_{Path(tokenizer).name}_{prompts}x{n}_cap{cap}_s{steps}_seed{seed}")
    if not (data / "train.parquet").exists():
        main(["--prompts", str(prompts), "--n", str(n), "--cap", str(cap), "--seed", str(seed), "--steps",
              str(steps), "--tokenizer", str(tokenizer), "--out", str(data)])
    return data


if __name__ == "__main__":
    main()
