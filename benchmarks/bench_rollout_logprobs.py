"""What asking vLLM for the sampled tokens' log-probs costs a generation, and what vLLM's flat form saves.

    python benchmarks/bench_rollout_logprobs.py --seqs 64 128 --response-len 2048 --reps 5   # on a GPU host

`rollout.calculate_log_probs=true` (split placement, rollout correction, bypass mode) asks vLLM for one
log-prob per generated token. Three variants of the same generation (random-weight Qwen2.5-0.5B
architecture, 512-token prompts, `ignore_eos`, temperature 1, CUDA graphs, vLLM's `processed_logprobs` as
rlpost's engine runs), alternated within each repetition: `none` (no log-probs), `dicts` (`logprobs=0`: one
dict and one Logprob object per token) and `flat` (`logprobs=0, flat_logprobs=True`: a few flat lists per
request; tells whether the per-token Python objects are the cost). Medians and spreads of `--reps` repetitions.
Writes one `benchmarks.harness` result, `benchmarks/results/<date>_<gpu>/rollout_logprobs.json` (or `--json-out`):
a `gen_s_<variant>_seqs<N>` metric per variant and batch (median, spread, every repetition), the rows under `rows`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from functools import partial
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.append(str(REPO))
sys.path.append(str(REPO / "benchmarks"))

import bench_limits  # noqa: E402

from benchmarks import harness  # noqa: E402

VARIANTS = {"none": {}, "dicts": {"logprobs": 0}, "flat": {"logprobs": 0, "flat_logprobs": True}}


def summarize(seqs: int, response_len: int, times: dict[str, list[float]]) -> dict[str, Any]:
    """One batch size's row: each variant's median seconds, every repetition, and the ratio to `none`."""
    row = {"seqs": seqs, "response_len": response_len,
           "median_s": {k: statistics.median(v) for k, v in times.items()}, "all_s": times}
    row["vs_none"] = {k: row["median_s"][k] / row["median_s"]["none"] for k in times}
    return row


def build_result(args: argparse.Namespace, rows: list[dict[str, Any]], env: dict[str, Any] | None = None
                 ) -> harness.Result:
    """The harness result of `rows` (from `summarize`): one timing metric per variant and batch size."""
    res = harness.Result("rollout_logprobs", harness.command_line(), args.reps, env=env or harness.environment())
    for row in rows:
        for name, times in row["all_s"].items():
            res.timing(f"gen_s_{name}_seqs{row['seqs']}", times, vs_none=row["vs_none"][name])
    res.extra.update(args=harness.params(args), rows=rows)
    return res


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqs", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--response-len", type=int, default=2048)
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--model", type=Path, default=Path("/tmp/m"))
    ap.add_argument("--json-out", type=Path, default=None)
    args = ap.parse_args(argv)

    import torch
    from vllm import LLM, SamplingParams

    if not (args.model / "config.json").exists():
        bench_limits.build_model(args.model)
    llm = LLM(model=str(args.model), dtype="bfloat16", seed=0, gpu_memory_utilization=0.6,
              max_model_len=args.prompt_len + args.response_len, logprobs_mode="processed_logprobs")
    sync = torch.cuda.synchronize
    rows = []
    for seqs in args.seqs:
        prompts = bench_limits.random_prompts(seqs, args.prompt_len)
        requests = [{"prompt_token_ids": row.tolist()} for row in prompts]
        llm.generate(requests, SamplingParams(max_tokens=64, ignore_eos=True, detokenize=False, logprobs=0),
                     use_tqdm=False)  # warm-up
        times: dict[str, list[float]] = {name: [] for name in VARIANTS}
        for rep in range(args.reps):
            order = list(VARIANTS) if rep % 2 == 0 else list(reversed(VARIANTS))
            for name in order:
                params = SamplingParams(n=1, temperature=1.0, max_tokens=args.response_len, ignore_eos=True,
                                        detokenize=False, **VARIANTS[name])
                s, outs = harness.timed(partial(llm.generate, requests, params, use_tqdm=False), sync)
                times[name].append(s)
                assert all(len(o.outputs[0].token_ids) == args.response_len for o in outs)
        row = summarize(seqs, args.response_len, times)
        print(json.dumps(row), flush=True)
        rows.append(row)
    print(f"wrote {build_result(args, rows).write(path=args.json_out)}")


if __name__ == "__main__":
    main()
