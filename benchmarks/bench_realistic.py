"""rlpost's GRPO step on the GSM8K-shaped workload against bare vLLM and the strong bare loops, paired rounds.

    python -m benchmarks.bench_realistic --model-dir /tmp/m_0.5b --prompts 64 --n 8 --rounds 12   # GPU host

Two processes on one GPU. The bare side (`--serve-bare`, started first): a vLLM engine with its defaults (the
same model, length and memory share), generating every sample to its own cap (`benchmarks.workload`), then the
strong bare log-prob pass and update (`benchmarks.strong_limits`) over the sequences it generated. The rlpost
side: rlpost's own `ActorRolloutRefWorker` running full GRPO steps (`bench_grpo_step.grpo_step`: the phases of
`RayPPOTrainer.train_step`, weight sync and sleep included) on the same prompts and caps, packed sequences,
dynamic micro-batches, the fused log-prob head, Liger where installed. Each side's engine sleeps while the
other works. Rounds alternate the order (`harness.alternate`); per round the ratios bare / rlpost of
generation, old_log_prob and the update, and both phases' MFU (6·N·tokens and 2·N·tokens over 989 TFLOP/s).
Writes `benchmarks/results/<date>_<gpu>/realistic.json` with issue 48's goals A1, A1_limit, A2, A2_limit, A3.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.append(str(REPO / "benchmarks"))

PEAK = 989e12  # H100/H200 dense bf16, the MFU denominator
TARGETS = {"A1": ">= 0.30", "A1_limit": ">= 0.95", "A2": ">= 0.35", "A2_limit": ">= 0.95",
           "A3": ">= 0.95, ci_low >= 0.90"}


def _sequences(args: argparse.Namespace) -> tuple[Any, list[list[int]]]:
    from benchmarks import workload

    wl = workload.gsm8k_shaped(args.prompts, args.n, args.cap, args.seed)
    return wl, workload.token_prompts(wl, args.vocab, args.seed)


def serve_bare(args: argparse.Namespace) -> None:
    """The bare side: engine and strong loops built, then one timed round per `round` line on stdin."""
    import torch
    from bench_limits import bare_engine
    from vllm import SamplingParams

    from benchmarks import harness
    from benchmarks.strong_limits import StrongLimits

    wl, prompts = _sequences(args)
    llm, start_s = bare_engine(args.model_dir, args.prompt_len + args.cap, args.gpu_memory_utilization, False)
    requests = [{"prompt_token_ids": prompts[i // args.n]} for i in range(len(wl.rows()))]
    params = [SamplingParams(n=1, temperature=1.0, max_tokens=r, ignore_eos=True, detokenize=False)
              for _, r in wl.rows()]
    sync = torch.cuda.synchronize if torch.cuda.is_available() else None
    asleep = [False]

    def generate() -> tuple[float, list[tuple[list[int], list[int]]]]:
        if asleep[0]:
            if sync is not None:  # the strong loops' cached blocks go back before the engine's KV comes back
                torch.cuda.empty_cache()
            llm.wake_up()
        seconds, outs = harness.timed(lambda: llm.generate(requests, params, use_tqdm=False), sync)
        if sync is not None:
            llm.sleep(level=1)  # the strong loops and the other side get the memory
            asleep[0] = True
        seqs = [(list(req["prompt_token_ids"]), list(o.outputs[0].token_ids)) for req, o in zip(requests, outs)]
        assert [len(r) for _, r in seqs] == [r for _, r in wl.rows()], "bare vLLM did not honour the caps"
        return seconds, seqs

    _, seqs = generate()  # warm-up (CUDA graphs captured at start; this fills the allocator)
    lim = StrongLimits(args.model_dir, seqs, args.fwd_tokens, args.train_tokens, bool(args.grad_ckpt),
                       "cuda" if sync else "cpu")
    lim.warm_up()
    harness.reply({"ready": True, "engine_start_s": start_s, "applied": lim.applied, "params": lim.params})
    for line in sys.stdin:
        if line.strip() != "round":
            break
        gen_s, seqs = generate()
        lim.set_batch(seqs, args.fwd_tokens, args.train_tokens)
        fwd_s, train_s = lim.fwd(), lim.train()
        harness.reply({"s": gen_s + fwd_s + train_s, "gen_s": gen_s, "fwd_s": fwd_s, "train_s": train_s,
                       "tokens": lim.tokens, "gen_tokens": sum(len(r) for _, r in seqs)})


def worker_overrides(args: argparse.Namespace, liger: bool) -> list[str]:
    """rlpost's settings for this run: packed, dynamic micro-batches, fused head (Liger where installed)."""
    arr = "actor_rollout_ref"
    over = [f"{arr}.model.use_remove_padding=true", f"{arr}.model.use_fused_kernels=true",
            f"{arr}.actor.use_dynamic_bsz=true", f"{arr}.actor.ppo_max_token_len_per_gpu={args.train_tokens}",
            f"{arr}.rollout.log_prob_max_token_len_per_gpu={args.fwd_tokens}",
            f"{arr}.ref.log_prob_use_dynamic_bsz=true", f"{arr}.ref.log_prob_max_token_len_per_gpu={args.fwd_tokens}"]
    return over + ([f"{arr}.model.use_liger=true"] if liger else []) + list(args.override)


def gen_batch(args: argparse.Namespace, wl: Any, prompts: list[list[int]]) -> Any:
    """The trainer's generation input: left-padded prompts, a uid per prompt, its caps; repeated n times."""
    import uuid

    import numpy as np
    import torch

    from rlpost import keys
    from rlpost.protocol import DataProto

    p = args.prompt_len
    ids = torch.zeros(len(prompts), p, dtype=torch.long)
    mask = torch.zeros(len(prompts), p, dtype=torch.long)
    for i, row in enumerate(prompts):
        ids[i, p - len(row):] = torch.tensor(row)
        mask[i, p - len(row):] = 1
    caps = np.empty(len(prompts), dtype=object)  # one list per prompt (a 2-D array would not repeat as rows)
    for i, row in enumerate(wl.caps):
        caps[i] = [int(c) for c in row]
    batch = DataProto.from_dict(
        tensors={keys.INPUT_IDS: ids, keys.ATTENTION_MASK: mask,
                 keys.POSITION_IDS: (mask.cumsum(-1) - 1).clamp(min=0)},
        non_tensors={keys.UID: np.array([str(uuid.uuid4()) for _ in prompts], dtype=object),
                     keys.RESPONSE_CAPS: caps})
    out = batch.repeat(args.n, interleave=True)
    out.meta_info.update({keys.META_DO_SAMPLE: True, keys.META_VALIDATE: False})
    return out


def summarize(res: Any, rounds: list[dict[str, Any]], params: int) -> None:
    """Ratios and MFU per round into `res`'s metrics and goals."""
    from benchmarks import harness

    res.reps = len(rounds)  # a run cut short counts the rounds it finished
    bare = [r["bare"] for r in rounds]
    ours = [r["rlpost"] for r in rounds]
    # rlpost masks a response after a sampled EOS token (a random model draws one now and then), the bare side
    # keeps every token: the counts agree to a fraction of a percent, and each side's MFU counts its own.
    worst = max(abs(b["tokens"] - o["tokens"]) / b["tokens"] for b, o in zip(bare, ours))
    assert worst < 0.02, f"the two sides ran different tokens ({worst:.1%} apart)"
    res.metric("token_count_gap", worst, unit="fraction")
    pairs = {"A3": ("gen_s", "gen"), "A1_limit": ("train_s", "update_actor_only"),
             "A2_limit": ("fwd_s", "old_log_prob")}
    for gid, (b_key, o_key) in pairs.items():
        stats = harness.paired_ratio([b[b_key] for b in bare], [o[o_key] for o in ours])
        res.metric(f"{o_key}_bare_over_rlpost", **{k: stats[k] for k in ("value", "ci_low", "ci_high", "values")},
                   unit="bare/rlpost")
        res.goal(gid, stats, TARGETS[gid])
    for gid, key, k in (("A1", "update_actor_only", 6), ("A2", "old_log_prob", 2)):
        stats = harness.geomean_ci([k * params * o["tokens"] / o[key] / PEAK for o in ours])
        res.metric(f"{key}_mfu", **{x: stats[x] for x in ("value", "ci_low", "ci_high", "values")}, unit="fraction")
        res.goal(gid, stats, TARGETS[gid])
    for name, side, key in (("rlpost_step_s", ours, "step"), ("rlpost_gen_s", ours, "gen"),
                            ("bare_gen_s", bare, "gen_s"), ("bare_fwd_s", bare, "fwd_s"),
                            ("bare_train_s", bare, "train_s"), ("rlpost_update_weights_s", ours, "update_weights")):
        s = harness.spread([x[key] for x in side])
        res.metric(name, s["median"], s["q1"], s["q3"], "s", [x[key] for x in side], spread="q1-q3")
    gen_tps = [b["gen_tokens"] / o["gen"] for b, o in zip(bare, ours)]
    res.metric("rlpost_gen_tokens_per_s", harness.spread(gen_tps)["median"], unit="tokens/s", values=gen_tps)


def run(args: argparse.Namespace) -> Any:
    import bench_grpo_step
    import torch

    from benchmarks import harness

    wl, prompts = _sequences(args)
    cmd = [sys.executable, "-m", "benchmarks.bench_realistic", "--serve-bare", *sys.argv[1:], "--vocab",
           str(args.vocab)]
    bare = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1, cwd=REPO)
    ready = harness.read_reply(bare.stdout, sys.stdout, "bench_realistic's bare side")
    res = harness.Result("realistic", harness.command_line(), args.rounds)
    res.extra.update({"bare_start": ready, "workload": {"prompts": args.prompts, "n": args.n, "cap": args.cap,
                      "seed": args.seed, "prompt_tokens": int(wl.prompt_lens.sum()), "response_tokens":
                      int(wl.caps.sum())}})
    step_args = argparse.Namespace(grad_ckpt=args.grad_ckpt, prompt_len=args.prompt_len, response_len=args.cap,
                                   n=args.n, enforce_eager=False, gpu_memory_utilization=args.gpu_memory_utilization,
                                   max_num_batched_tokens=16384, fwd_micro=32, train_micro=32,
                                   mini_prompts=args.prompts, override=worker_overrides(args,
                                                                                        ready["applied"]["liger"]))
    res.extra["rlpost_overrides"] = step_args.override
    device = "cuda" if torch.cuda.is_available() else "cpu"
    worker = bench_grpo_step.start_worker(bench_grpo_step.grpo_config(args.model_dir, step_args), device)
    batch = gen_batch(args, wl, prompts)
    bench_grpo_step.grpo_step(worker, batch, args.n)  # untimed: optimiser state, first sync, compilation

    def bare_round() -> dict[str, Any]:
        bare.stdin.write("round\n")
        return harness.read_reply(bare.stdout, sys.stdout, "bench_realistic's bare side")

    def on_round(row: dict[str, Any]) -> None:
        b, o = row["bare"], row["rlpost"]
        print(f"[realistic] round {row['round']} {row['order']}: bare gen {b['gen_s']:.2f}s fwd {b['fwd_s']:.2f}s "
              f"train {b['train_s']:.2f}s | rlpost gen {o['gen']:.2f}s old_log_prob {o['old_log_prob']:.2f}s "
              f"update {o['update_actor_only']:.2f}s step {o['step']:.2f}s", flush=True)
        res.extra.setdefault("rounds", []).append(row)
        if len(res.extra["rounds"]) >= 2:  # a run cut short keeps what it measured
            summarize(res, res.extra["rounds"], ready["params"])
            res.write(session=args.session)

    try:
        def rlpost_step() -> dict[str, Any]:
            timing = bench_grpo_step.grpo_step(worker, batch, args.n)
            return {**timing, "s": timing["step"]}

        rounds = harness.alternate({"bare": bare_round, "rlpost": rlpost_step}, args.rounds, on_round=on_round)
    finally:
        bare.stdin.close()
        try:
            bare.wait(timeout=120)
        except subprocess.TimeoutExpired:
            bare.kill()
    summarize(res, rounds, ready["params"])
    return res


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    from benchmarks import strong_limits

    strong_limits.add_paired_arguments(ap, rounds=12, worker="worker")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.35, help="each engine's share")
    ap.add_argument("--vocab", type=int, default=150000, help=argparse.SUPPRESS)
    ap.add_argument("--serve-bare", action="store_true", help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def resummarize(path: Path) -> Path:
    """Recompute a written realistic.json's metrics and goals from the rounds it holds (after a fix to the
    summary; the measurements, environment and command stay as recorded)."""
    from benchmarks import harness

    data = json.loads(path.read_text())
    res = harness.Result("realistic", data["command"], data["reps"], env=data["env"])
    res.extra.update({k: v for k, v in data.items() if k not in res.to_dict()})
    summarize(res, data["rounds"], data["bare_start"]["params"])
    return res.write(path=path)


def main() -> None:
    if sys.argv[1:2] == ["--resummarize"]:
        for name in sys.argv[2:]:
            print(f"[realistic] rewrote {resummarize(Path(name))}")
        return
    args = parse_args()
    if args.serve_bare:
        return serve_bare(args)
    import bench_limits

    args.vocab = bench_limits.model_vocab(args.model_dir)
    res = run(args)
    print("[realistic] " + json.dumps(res.goals), flush=True)
    print(f"[realistic] wrote {res.write(session=args.session)}", flush=True)


if __name__ == "__main__":
    main()
