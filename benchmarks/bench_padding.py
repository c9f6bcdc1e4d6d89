"""Remove-padding against padded batches in rlpost's actor, paired rounds: fixed lengths and the realistic workload.

    python -m benchmarks.bench_padding --model-dir /tmp/m_0.5b --rounds 5 \\
        --realistic-json benchmarks/results/<date>_h200/realistic.json        # GPU host

One actor-only `ActorRolloutRefWorker` (`bench_kernels.actor_worker`, fused log-prob head on) switches
`use_remove_padding` between rounds' halves (`harness.alternate`): old_log_prob (with entropy) and
update_actor on the same rows. Two batches: every sequence `--fixed-prompt` + `--fixed-response` tokens (no
padding to remove: goal C1, packed at least as fast), and the GSM8K-shaped workload padded to
`--prompt-len` + `--cap` (goal C2). C2 is a per-step figure: with `--realistic-json` (a `bench_realistic` run of
the same workload) each round's padded step is that run's median step plus this round's extra time of the
padded log-prob passes (old_log_prob and ref, the same forward) and update; without it C2 is not measured and
the phase ratio alone is reported.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.append(str(REPO / "benchmarks"))

TARGETS = {"C1": ">= 1.00", "C2": ">= 1.3"}


def batch_of(lengths: list[tuple[int, int]], prompt_len: int, response_len: int, vocab: int) -> Any:
    """Rows of (real prompt, real response) tokens, prompts left-padded to `prompt_len`, responses right-padded
    to `response_len`, with old/ref log-probs and advantages (what update_actor reads)."""
    from rlpost import keys
    from rlpost.protocol import DataProto

    g = torch.Generator().manual_seed(0)
    b = len(lengths)
    p_len = torch.tensor([p for p, _ in lengths])
    r_len = torch.tensor([r for _, r in lengths])
    p_mask = (torch.arange(prompt_len)[None] >= prompt_len - p_len[:, None]).long()
    r_mask = (torch.arange(response_len)[None] < r_len[:, None]).long()
    attn = torch.cat([p_mask, r_mask], dim=1)
    ids = torch.randint(10, vocab, (b, prompt_len + response_len), generator=g) * attn
    return DataProto.from_dict(tensors={
        keys.INPUT_IDS: ids, keys.ATTENTION_MASK: attn, keys.POSITION_IDS: (attn.cumsum(-1) - 1).clamp(min=0),
        keys.RESPONSES: ids[:, prompt_len:], keys.RESPONSE_MASK: r_mask,
        keys.OLD_LOG_PROBS: torch.full((b, response_len), -12.0),
        keys.REF_LOG_PROB: torch.full((b, response_len), -12.0),
        keys.ADVANTAGES: torch.randn(b, response_len, generator=g)}, meta_info={keys.META_TEMPERATURE: 1.0})


def variant_round(worker: Any, batch: Any, packed: bool, cuda: bool) -> dict[str, float]:
    """old_log_prob then update_actor with use_remove_padding=`packed` (fused head on)."""
    from bench_kernels import timed_phase

    worker.actor.use_remove_padding, worker.actor.use_fused_kernels = packed, True
    olp, _ = timed_phase(lambda: worker.compute_log_prob(batch), cuda)
    upd, _ = timed_phase(lambda: worker.update_actor(batch), cuda)
    return {"s": olp + upd, "old_log_prob": olp, "update": upd}


def measure(worker: Any, batch: Any, rounds: int, cuda: bool) -> list[dict[str, Any]]:
    from benchmarks import harness

    sides = {"padded": lambda: variant_round(worker, batch, False, cuda),
             "packed": lambda: variant_round(worker, batch, True, cuda)}
    for side in sides.values():  # warm-up of both paths
        side()
    return harness.alternate(sides, rounds, on_round=lambda r: print(
        f"[padding] round {r['round']}: padded {r['padded']['s']:.2f}s packed {r['packed']['s']:.2f}s", flush=True))


def step_ratios(rounds: list[dict[str, Any]], realistic: dict[str, Any]) -> list[float]:
    """Per round: (median rlpost step + the padded passes' extra time) / median rlpost step, where the log-prob
    pass runs twice per step (old_log_prob and ref)."""
    step = statistics.median(r["rlpost"]["step"] for r in realistic["rounds"])
    out = []
    for r in rounds:
        extra = 2 * (r["padded"]["old_log_prob"] - r["packed"]["old_log_prob"]) + (r["padded"]["update"]
                                                                                  - r["packed"]["update"])
        out.append((step + extra) / step)
    return out


def main(argv: list[str] | None = None) -> None:
    from bench_kernels import actor_worker

    from benchmarks import harness, workload

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    workload.add_arguments(ap)
    ap.add_argument("--prompt-len", type=int, default=192)
    ap.add_argument("--fixed-prompt", type=int, default=128)
    ap.add_argument("--fixed-response", type=int, default=256)
    ap.add_argument("--micro", type=int, default=32, help="rows per micro-batch (both variants)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--realistic-json", type=Path, default=None)
    ap.add_argument("--override", nargs="*", default=[])
    ap.add_argument("--session", type=Path, default=None)
    args = ap.parse_args(argv)
    cuda = torch.cuda.is_available()
    res = harness.Result("padding", harness.command_line(), args.rounds)
    wl = workload.gsm8k_shaped(args.prompts, args.n, args.cap, args.seed)
    batches = {"C1": ([(args.fixed_prompt, args.fixed_response)] * (args.prompts * args.n), args.fixed_prompt,
                      args.fixed_response), "C2": (wl.rows(), args.prompt_len, args.cap)}
    wargs = argparse.Namespace(prompt_len=args.prompt_len, response_len=args.cap, n=args.n, micro=args.micro,
                               prompts=args.prompts, override=args.override)
    worker = actor_worker(args.model_dir, wargs, "cuda" if cuda else "cpu")  # the batch's shape sets the lengths
    for gid, (lengths, p_len, r_len) in batches.items():
        batch = batch_of(lengths, p_len, r_len, worker.actor_module.config.vocab_size)
        rounds = measure(worker, batch, args.rounds, cuda)
        phases = harness.paired_ratio([r["padded"]["s"] for r in rounds], [r["packed"]["s"] for r in rounds])
        res.metric(f"{gid}_phases_padded_over_packed", **{k: phases[k] for k in ("value", "ci_low", "ci_high",
                                                                                 "values")}, unit="x")
        res.extra[f"{gid}_rounds"] = rounds
        if gid == "C1":
            res.goal("C1", phases, TARGETS["C1"], note="old_log_prob + update_actor, fixed lengths")
        elif args.realistic_json is not None:
            stats = harness.geomean_ci(step_ratios(rounds, json.loads(args.realistic_json.read_text())))
            res.goal("C2", stats, TARGETS["C2"], note="per step: bench_realistic's median step plus the padded "
                     "passes' extra time (old_log_prob, ref, update) of each round")
        else:
            res.not_measured("C2", TARGETS["C2"], "no --realistic-json: only the phase ratio was measured")
    print(f"[padding] {json.dumps(res.goals)} -> {res.write(session=args.session)}", flush=True)


if __name__ == "__main__":
    main()
