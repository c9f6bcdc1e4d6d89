"""Each phase alone on one GPU, then on every GPU at once: what a host costs bare engines that share nothing.

    python3 benchmarks/bench_gen_concurrent.py --gpus 4 --model-dir /tmp/m_0.5b --prompt-len 28 --reps 7

One process per GPU, each with its own bare vLLM engine (`bench_limits.bare_engine`; the GPU example's scheduler
limits, one request per sample as the rollout sends them) and, with `--phases gen train`, its own plain training
loop (`bench_limits.train_pass`, no FSDP, no communication). Each process runs with `--threads` CPU threads (1, as
Ray gives a `main_ppo` worker). A phase first runs once on every rank, untimed. Then each repetition runs it
twice, in alternating order: "solo" (one rank works, the others wait at a barrier; the solo rank moves round the
GPUs) and "all" (every rank at once; the time is the slowest rank's). Nothing is shared between the processes but
the host: its cores, memory bandwidth and PCIe. `solo / all` is these bare engines' weak-scaling efficiency on this
host, to read beside `bench_scale.py`'s efficiency through `main_ppo`: both the ratio of the medians and the median
of the per-repetition ratios (the pairs the alternating order makes). Builds the random-weight model of `--arch`
into `--model-dir` when it is not there. Writes one `benchmarks.harness` result,
`benchmarks/results/<date>_<gpu|cpu>/gen_concurrent_x<gpus>.json` (or `--json-out`): `<phase>_solo_s` and
`<phase>_all_s` timing metrics (median, spread, every repetition), `<phase>_efficiency` (ratio of the medians) and
`<phase>_paired_efficiency` (geometric mean of the per-repetition ratios with its 95 % interval); every time, each
rank's record and the summary beside them.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import queue
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.append(str(REPO))

from benchmarks import harness  # noqa: E402

MODES = ("solo", "all")


def solo_rank(rep: int, world: int) -> int:
    """The rank that works alone in repetition `rep`: each GPU in turn."""
    return rep % world


def summarize(times: dict[str, dict[str, list[list[float]]]]) -> dict[str, Any]:
    """Medians, ranges and efficiency per phase.

    Args:
        times: phase -> mode -> one list per repetition of the working ranks' seconds (solo: the one rank).

    Returns:
        phase -> {solo_s, solo_range, all_s (median of the slowest rank), all_range, all_rank_median_s
        (median over repetitions of the median rank), efficiency (solo_s / all_s), paired_efficiency (median
        over repetitions of solo / slowest rank)}.
    """
    out = {}
    for phase, by_mode in times.items():
        solo = [max(r) for r in by_mode["solo"]]
        slowest = [max(r) for r in by_mode["all"]]
        middle = [statistics.median(r) for r in by_mode["all"]]
        out[phase] = {
            "solo_s": statistics.median(solo), "solo_range": [min(solo), max(solo)],
            "all_s": statistics.median(slowest), "all_range": [min(slowest), max(slowest)],
            "all_rank_median_s": statistics.median(middle),
            "efficiency": statistics.median(solo) / statistics.median(slowest),
            "paired_efficiency": statistics.median(a / b for a, b in zip(solo, slowest)),
        }
    return out


def _worker(rank: int, args: argparse.Namespace, barrier: Any, results: Any) -> None:
    """One GPU's process: build the engine (and model), run every repetition, put (rank, record) on `results`."""
    import torch

    import bench_limits as bl

    torch.set_num_threads(args.threads)
    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        raise RuntimeError(f"rank {rank}: no GPU visible (CUDA_VISIBLE_DEVICES="
                           f"{os.environ.get('CUDA_VISIBLE_DEVICES')!r})")
    max_len = args.prompt_len + args.response_len
    vocab = json.loads((args.model_dir / "config.json").read_text())["vocab_size"]
    prompts = bl.random_prompts(args.prompts, args.prompt_len, seed=rank, high=min(vocab, 150000))
    times: dict[str, dict[str, list[float | None]]] = {}

    def run_phase(phase: str, work: Any) -> None:
        barrier.wait()
        work()  # warm-up at full size, every rank at once
        times[phase] = {m: [] for m in MODES}
        for rep in range(args.reps):
            for mode in harness.order(rep, MODES):
                barrier.wait()
                works = mode == "all" or rank == solo_rank(rep, args.gpus)
                times[phase][mode].append(harness.timed(work, bl.sync)[0] if works else None)
                barrier.wait()

    llm = None
    if "gen" in args.phases:
        from vllm import SamplingParams

        llm, _ = bl.bare_engine(args.model_dir, max_len, args.gpu_memory_utilization, args.enforce_eager,
                                max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens)
        # as the rollout sends them: each of the n samples of a prompt is its own request (n=1)
        params = SamplingParams(n=1, temperature=1.0, max_tokens=args.response_len, ignore_eos=True,
                                detokenize=False)
        requests = [{"prompt_token_ids": row.tolist()} for row in prompts for _ in range(args.n)]
        run_phase("gen", lambda: llm.generate(requests, params, use_tqdm=False))
    if "train" in args.phases:
        from transformers import AutoModelForCausalLM

        if cuda and llm is not None:
            llm.sleep(level=1)  # frees the KV cache and offloads the engine's weights
        dtype = torch.bfloat16 if cuda else torch.float32
        model = AutoModelForCausalLM.from_pretrained(str(args.model_dir), dtype=dtype, attn_implementation="sdpa")
        model = model.to("cuda" if cuda else "cpu")
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        rows = args.prompts * args.n
        ids = torch.randint(10, min(vocab, 150000), (rows, max_len), generator=torch.Generator().manual_seed(rank))
        ids = ids.pin_memory() if cuda else ids
        opt = bl.adamw(model)
        adv = torch.randn(rows, device=model.device)
        run_phase("train", lambda: bl.train_pass(model, opt, adv, ids, args.prompt_len, args.micro, rows))
    record = {"cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"), "threads": torch.get_num_threads(),
              "device": (harness.gpu_name() if cuda else None) or "cpu", "times": times}
    results.put((rank, record))


def _devices(gpus: int, cuda: bool) -> list[str | None]:
    """Each rank's CUDA_VISIBLE_DEVICES: one of the parent's visible GPUs (None on CPU)."""
    if not cuda:
        return [None] * gpus
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    import torch

    ids = visible.split(",") if visible else [str(i) for i in range(torch.cuda.device_count())]
    if gpus > len(ids):
        raise SystemExit(f"bench_gen_concurrent: --gpus {gpus} but {len(ids)} GPU(s) are visible; "
                         f"use --gpus {len(ids)}")
    return ids[:gpus]


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Start one process per GPU, collect their times, summarize. The parent never touches a GPU."""
    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(args.gpus), ctx.Queue()
    procs = []
    saved = dict(os.environ)
    try:
        for rank, dev in enumerate(_devices(args.gpus, args.device == "cuda")):
            os.environ["OMP_NUM_THREADS"] = str(args.threads)  # a spawned child inherits the environment
            if dev is not None:
                os.environ["CUDA_VISIBLE_DEVICES"] = dev
            proc = ctx.Process(target=_worker, args=(rank, args, barrier, results), daemon=False)
            proc.start()
            procs.append(proc)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    per_rank: dict[int, Any] = {}
    deadline = time.monotonic() + args.timeout
    while len(per_rank) < args.gpus:
        if time.monotonic() > deadline or any(p.exitcode not in (None, 0) for p in procs):
            for p in procs:
                p.kill()
            for p in procs:
                p.join(5)
            raise SystemExit(f"bench_gen_concurrent: a worker failed or the run passed --timeout "
                             f"{args.timeout} s (exit codes {[p.exitcode for p in procs]})")
        try:
            rank, record = results.get(timeout=1.0)
        except queue.Empty:
            continue
        per_rank[rank] = record
    for p in procs:
        p.join()
    reps = range(args.reps)
    phases = per_rank[0]["times"]
    # phase -> mode -> per repetition the working ranks' seconds
    joined = {phase: {"solo": [[per_rank[solo_rank(i, args.gpus)]["times"][phase]["solo"][i]] for i in reps],
                      "all": [[per_rank[r]["times"][phase]["all"][i] for r in range(args.gpus)] for i in reps]}
              for phase in phases}
    ranks = [{k: v for k, v in per_rank[r].items() if k != "times"} for r in range(args.gpus)]
    return {"ranks": ranks, "times": joined, "summary": summarize(joined)}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=4, help="processes, one GPU each")
    ap.add_argument("--device", choices=["cuda", "cpu"], default=None, help="default: cuda when there is a GPU")
    ap.add_argument("--model-dir", type=Path, required=True,
                    help="a model saved by bench_limits.build_model (built here, of --arch, when missing)")
    ap.add_argument("--arch", choices=["0.5b", "7b"], default="0.5b")
    ap.add_argument("--threads", type=int, default=1, help="CPU threads per process (Ray gives a worker 1)")
    ap.add_argument("--phases", nargs="+", choices=["gen", "train"], default=["gen", "train"])
    ap.add_argument("--prompts", type=int, default=64, help="prompts per GPU")
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--response-len", type=int, default=512)
    ap.add_argument("--micro", type=int, default=32, help="rows per training micro-batch")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.6, help="the GPU example's")
    ap.add_argument("--enforce-eager", action="store_true")
    ap.add_argument("--max-num-seqs", type=int, default=1024, help="rollout.max_num_seqs (verl's default)")
    ap.add_argument("--max-num-batched-tokens", type=int, default=16384,
                    help="rollout.max_num_batched_tokens (the GPU example's)")
    ap.add_argument("--timeout", type=float, default=540.0, help="seconds before the workers are killed")
    ap.add_argument("--json-out", type=Path, default=None)
    return ap.parse_args(argv)


def build_result(args: argparse.Namespace, out: dict[str, Any], env: dict[str, Any] | None = None
                 ) -> harness.Result:
    """The harness result of `run`'s output: per phase the solo and all-at-once times (all: the slowest rank)
    and the efficiencies."""
    res = harness.Result(f"gen_concurrent_x{args.gpus}", harness.command_line(), args.reps,
                         env=env or harness.environment())
    for phase, by_mode in out["times"].items():
        solo, slowest = [max(r) for r in by_mode["solo"]], [max(r) for r in by_mode["all"]]
        res.timing(f"{phase}_solo_s", solo)
        res.timing(f"{phase}_all_s", slowest, note="slowest rank of each repetition")
        res.metric(f"{phase}_efficiency", out["summary"][phase]["efficiency"], unit="solo/all (medians)")
        paired = harness.paired_ratio(solo, slowest)
        res.metric(f"{phase}_paired_efficiency", paired["value"], paired["ci_low"], paired["ci_high"],
                   unit="solo/all", values=paired["values"], method=paired["method"])
    res.extra.update(args=harness.params(args), **out)
    return res


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    import bench_limits as bl

    if args.device is None:
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    bl.ensure_model(args.model_dir, args.arch)  # in a child: this process never touches a GPU
    out = run(args)
    for phase, s in out["summary"].items():
        print(f"[concurrent] {phase}: solo {s['solo_s']:.3f} s {s['solo_range']}, all {args.gpus} at once "
              f"{s['all_s']:.3f} s {s['all_range']} (median rank {s['all_rank_median_s']:.3f} s): "
              f"efficiency {s['efficiency']:.3f}, paired {s['paired_efficiency']:.3f}", flush=True)
    print(f"[concurrent] wrote {build_result(args, out).write(path=args.json_out)}", flush=True)


if __name__ == "__main__":
    main()
