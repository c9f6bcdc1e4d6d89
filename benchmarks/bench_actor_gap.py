"""Where rlpost's old_log_prob and update_actor lose to bare loops over the same tokens, on one GPU.

    python benchmarks/bench_actor_gap.py --prompt-real 28                 # GPU: main_ppo's rows (64 x 8)
    python benchmarks/bench_actor_gap.py --prompt-real 28 --tag bf16 \\
        --override actor_rollout_ref.actor.fsdp_config.model_dtype=bf16   # the same with bf16 master weights
    python benchmarks/bench_actor_gap.py --toy --reps 2                   # CPU smoke test
    python benchmarks/bench_actor_gap.py --profile                        # timings only

The rows are bench_kernels.py's (prompts left-padded to --prompt-len around --prompt-real real tokens, every
response --response-len tokens), run through one actor worker with remove-padding, as the GPU examples run.
The bare side is bench_limits.py's bf16 model (SDPA, gradient checkpointing) over the same real tokens as a
dense (B, prompt_real + R) tensor. Each repetition runs rlpost's old_log_prob (log-probs and entropy), the bare
forward, rlpost's update_actor and the bare training loop, in that order; medians and every repetition are
written. Then one torch.profiler pass of each of the four splits its wall time into device-busy time (the union of
kernel intervals) and idle time, and counts kernels and host synchronisations: rlpost's gap to bare is then
extra device work (busy minus bare busy) plus idle device (wall minus busy).
Writes one `benchmarks.harness` result, `benchmarks/results/<date>_<gpu|cpu>/actor_gap[_toy][_<tag>].json`
(`--out-dir` for another folder), first after the timings, again after each profile: a `<phase>_s` timing metric
each (median, spread, every repetition), the ratios as metrics, the per-phase summaries and profiles beside them.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.append(str(REPO))  # after PYTHONPATH: a snapshot of rlpost put there wins
sys.path.append(str(REPO / "benchmarks"))
sys.path.append(str(REPO / "scripts"))  # trace_summary

import bench_kernels  # noqa: E402
import bench_limits  # noqa: E402
from trace_summary import union_length  # noqa: E402

from benchmarks import harness  # noqa: E402
from rlpost import keys  # noqa: E402

PHASES = ("rlpost_old_log_prob", "bare_forward", "rlpost_update", "bare_train")
# host-side events that wait for the device (a read of a device value, or an explicit wait)
SYNC_EVENTS = ("aten::_local_scalar_dense", "aten::nonzero", "cudaStreamSynchronize", "cudaDeviceSynchronize",
               "cudaEventSynchronize")


def dense_rows(batch: Any, prompt_len: int, prompt_real: int) -> torch.Tensor:
    """The real tokens of fixed-length rows as one (B, prompt_real + R) tensor (prompts are left-padded)."""
    return batch.batch[keys.INPUT_IDS][:, prompt_len - prompt_real:].contiguous()


def bare_loops(model: Any, dense: torch.Tensor, prompt_real: int, micro: int) -> tuple[Any, Any]:
    """bench_limits' bare forward and training loop over all rows, as calls without their own warm-up or
    timing (one optimizer kept across calls; one optimizer step over all rows)."""
    opt = bench_limits.adamw(model)
    adv = torch.randn(len(dense), device=model.device)
    return (lambda: bench_limits.forward_pass(model, dense, prompt_real, micro),
            lambda: bench_limits.train_pass(model, opt, adv, dense, prompt_real, micro, len(dense)))


def phase_fns(worker: Any, batch: Any, model: Any, dense: torch.Tensor, args: argparse.Namespace
              ) -> dict[str, Any]:
    """Name -> a call running that phase once over all rows (one mini-batch: ppo_mini_batch_size = prompts)."""
    forward, train = bare_loops(model, dense, args.prompt_real, args.micro)
    return {"rlpost_old_log_prob": lambda: worker.compute_log_prob(batch), "bare_forward": forward,
            "rlpost_update": lambda: worker.update_actor(batch), "bare_train": train}


def busy_seconds(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of (start, end) intervals (microseconds in, seconds out)."""
    return union_length(intervals) / 1e6


def profiled(fn: Any, cuda: bool, top: int = 40) -> dict[str, Any]:
    """One call under torch.profiler: wall, device busy and idle time, kernels, host syncs, top kernels and
    top aten ops by device time with their input shapes."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    if cuda:
        torch.cuda.synchronize()
    with profile(activities=acts, record_shapes=True) as prof:
        start = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize()
        wall = time.perf_counter() - start
    events = prof.events()
    device = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
    busy = busy_seconds([(e.time_range.start, e.time_range.end) for e in device]) if cuda else None
    averages = prof.key_averages()
    counts = {e.key: e.count for e in averages}
    ops = [e for e in averages if e.key.startswith("aten::")]
    return {
        "wall_s": wall, "device_busy_s": busy, "device_idle_s": None if busy is None else wall - busy,
        "kernels": len(device), "aten_ops": sum(e.count for e in ops),
        "syncs": {k: counts[k] for k in SYNC_EVENTS if k in counts},
        "top_kernels_by_time": [(e.key[:90], e.count, round(e.self_device_time_total / 1e3, 2))
                                for e in sorted(averages, key=lambda e: -e.self_device_time_total)
                                if e.self_device_time_total > 0 and not e.key.startswith(("aten::", "cuda"))][:top],
        "top_ops_by_count": [(e.key[:90], e.count) for e in sorted(ops, key=lambda e: -e.count)][:top],
        "top_ops_by_device_time_and_shape": [
            (e.key, str(e.input_shapes)[:160], e.count, round(e.self_device_time_total / 1e3, 2))
            for e in sorted(prof.key_averages(group_by_input_shape=True), key=lambda e: -e.self_device_time_total)
            if e.key.startswith("aten::")][:top],
    }


def measure(fns: dict[str, Any], reps: int) -> dict[str, Any]:
    """A warm-up round, then `reps` rounds of all phases in order; medians, ranges, every repetition."""
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            times[name].append(harness.timed(fn, bench_limits.sync)[0])
    out: dict[str, Any] = {}
    for name, v in times.items():
        sp = harness.spread(v)
        out[name] = {"median_s": sp["median"], "q1_s": sp["q1"], "q3_s": sp["q3"], "min_s": sp["min"],
                     "max_s": sp["max"], "all_s": v}
    out["ratios"] = {"old_log_prob": out["bare_forward"]["median_s"] / out["rlpost_old_log_prob"]["median_s"],
                     "update": out["bare_train"]["median_s"] / out["rlpost_update"]["median_s"]}
    return out


def build_result(args: argparse.Namespace, res: dict[str, Any], env: dict[str, Any] | None = None
                 ) -> harness.Result:
    """The harness result of the timings in `res` (from `measure`, with tokens and profiles beside them)."""
    name = f"actor_gap{'_toy' if args.toy else ''}{'_' + args.tag if args.tag else ''}"
    out = harness.Result(name, harness.command_line(), args.reps, env=env or harness.environment())
    for phase in PHASES:
        out.timing(f"{phase}_s", res[phase]["all_s"])
    for phase, ratio in res["ratios"].items():
        out.metric(f"{phase}_bare_over_rlpost", ratio, unit="bare/rlpost (medians)")
    out.extra.update(args=harness.params(args), **res)
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--prompt-real", type=int, default=28, help="real tokens per prompt, left-padded")
    ap.add_argument("--response-len", type=int, default=512)
    ap.add_argument("--micro", type=int, default=32, help="rows per micro-batch, rlpost and bare")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--logprob-kernel", default="auto", choices=["auto", "torch"],
                    help="rlpost's log-prob maths: auto (Triton on CUDA) or torch (float32 chunks)")
    ap.add_argument("--profile", nargs="*", default=list(PHASES), choices=list(PHASES),
                    help="phases to profile after the timed repetitions (none: no profile)")
    ap.add_argument("--toy", action="store_true", help="CPU smoke test: tiny model, 2 x 4 rows, 16 + 16 tokens")
    ap.add_argument("--override", nargs="*", default=[], help="extra ppo_trainer overrides for the rlpost worker")
    ap.add_argument("--tag", default="", help="suffix of the JSON's name")
    ap.add_argument("--out-dir", type=Path, default=None,
                    help="folder of the result (default benchmarks/results/<date>_<gpu|cpu>)")
    args = ap.parse_args(argv)
    if args.toy:
        args.prompts, args.n, args.prompt_len, args.prompt_real, args.response_len, args.micro = 2, 4, 16, 6, 16, 4
    if not 1 <= args.prompt_real <= args.prompt_len:
        ap.error(f"--prompt-real {args.prompt_real}: give 1..{args.prompt_len} (--prompt-len) real tokens per prompt")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    cuda = torch.cuda.is_available() and not args.toy
    # bench_kernels' worker and rows: micro-batches of --micro rows, one mini-batch of all prompts, KL loss
    args.min_response = args.response_len
    with tempfile.TemporaryDirectory() as tmp:
        if args.toy:
            from rlpost.utils.tiny_model import build_tiny_model

            model_dir = build_tiny_model(Path(tmp) / "tiny")
        else:
            model_dir = bench_limits.build_model(Path(tmp) / "qwen05_random")
        worker = bench_kernels.actor_worker(Path(model_dir), args, "cuda" if cuda else "cpu")
        worker.actor.logprob_kernel = args.logprob_kernel
        batch = bench_kernels.rows(args, worker.actor_module.config.vocab_size, uniform=False)
        dense = dense_rows(batch, args.prompt_len, args.prompt_real)
        from transformers import AutoModelForCausalLM

        dtype = torch.bfloat16 if cuda else torch.float32
        model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype, attn_implementation="sdpa")
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if cuda:
            model, dense = model.cuda(), dense.pin_memory()
        fns = phase_fns(worker, batch, model, dense, args)
        res: dict[str, Any] = {"tokens": {"real": int(dense.numel()),
                                          "padded": int(batch.batch[keys.ATTENTION_MASK].numel())}}
        res.update(measure(fns, args.reps))
        for name in PHASES:
            print(f"[gap] {name}: {res[name]['median_s']:.3f} s [{res[name]['min_s']:.3f}, {res[name]['max_s']:.3f}]",
                  flush=True)
        print(f"[gap] bare / rlpost: {json.dumps({k: round(v, 3) for k, v in res['ratios'].items()})}", flush=True)
        env = harness.environment()
        def write() -> Path:
            return build_result(args, res, env).write(session=args.out_dir)

        path = write()  # the timings, even if the profile runs out of time
        res["profile"] = {}
        for name in args.profile:
            res["profile"][name] = prof = profiled(fns[name], cuda)
            summary = {k: prof[k] for k in ("wall_s", "device_busy_s", "device_idle_s", "kernels", "aten_ops", "syncs")}
            print(f"[gap] profile {name}: " + json.dumps(summary), flush=True)
            write()
    print(f"wrote {path}")
    return res


if __name__ == "__main__":
    main()
