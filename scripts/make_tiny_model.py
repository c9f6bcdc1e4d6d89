"""Build the tiny Qwen2 model + BPE tokenizer used by tests, examples and the quickstart.

    python scripts/make_tiny_model.py --out_dir ~/models/tiny-qwen2 [--hidden_size 128 --num_layers 2]
    python scripts/make_tiny_model.py --out_dir ~/models/tiny-tools --corpus_file corpus.txt --vocab_size 1024
    python scripts/make_tiny_model.py --out_dir ~/models/tiny-qwen3-moe --arch qwen3_moe   # any family of
        # rlpost.utils.tiny_families: qwen3_moe, qwen3_next, qwen3_5, deepseek_v3, gemma2, gpt_oss, ...
    python scripts/make_tiny_model.py --out_dir ~/models/tiny-qwen2-vl --arch qwen2_vl   # + a processor
    python scripts/make_tiny_model.py --out_dir ~/models/tiny-qwen2.5-vl --arch qwen2_5_vl

`--corpus_file` (one text per line) adds that text to the tokenizer's arithmetic corpus, e.g.
transcripts with tool calls, so they take few tokens.
"""

import argparse
from pathlib import Path

from rlpost.utils.tiny_model import build_tiny_model, default_corpus


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out_dir", required=True)
    p.add_argument("--vocab_size", type=int, default=512)
    p.add_argument("--hidden_size", type=int, default=128)
    p.add_argument("--num_layers", type=int, default=2)
    p.add_argument("--num_heads", type=int, default=2, help="head_dim = hidden_size / num_heads must be 64")
    p.add_argument("--num_kv_heads", type=int, default=1)
    p.add_argument("--intermediate_size", type=int, default=256)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--arch", default="qwen2",
                   help="qwen2, qwen2_vl, qwen2_5_vl, or a family of rlpost.utils.tiny_families")
    p.add_argument("--corpus_file", default=None, help="tokenizer corpus (one text per line), added to the default")
    a = p.parse_args()
    corpus = None
    if a.corpus_file:
        corpus = default_corpus() + Path(a.corpus_file).read_text().splitlines()
    if a.arch in ("qwen2_vl", "qwen2_5_vl"):  # vision-language: rlpost.utils.tiny_vl_model (model + processor)
        from rlpost.utils.tiny_vl_model import build_tiny_vl_model

        out = build_tiny_vl_model(a.out_dir, corpus=corpus, vocab_size=a.vocab_size, seed=a.seed, arch=a.arch,
                                  hidden_size=a.hidden_size, num_layers=a.num_layers, num_heads=a.num_heads,
                                  num_kv_heads=a.num_kv_heads, intermediate_size=a.intermediate_size)
        print(f"tiny vision-language model written to {out}")
        return
    out = build_tiny_model(
        a.out_dir, corpus=corpus, vocab_size=a.vocab_size, hidden_size=a.hidden_size, num_layers=a.num_layers,
        num_heads=a.num_heads, num_kv_heads=a.num_kv_heads, intermediate_size=a.intermediate_size, seed=a.seed,
        arch=a.arch,
    )
    print(f"tiny model written to {out}")


if __name__ == "__main__":
    main()
