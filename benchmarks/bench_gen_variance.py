"""Why one bare vLLM generation of fixed work takes 5 s one time and 10 s the next: each repetition beside what the
host, the process, the engine's scheduler steps and the GPU did meanwhile.

    python3 benchmarks/bench_gen_variance.py --model-dir /tmp/m_0.5b --prompt-len 28 --reps 10

One process, one bare engine (`bench_limits.bare_engine`, the GPU example's scheduler limits), one request per
sample as the rollout sends them, `ignore_eos` (every repetition generates the same number of tokens). The
variants run round-robin, the first one moving each round, so a drift of the host lands on all of them:

- `default`: 1 CPU thread for torch, as Ray gives a `main_ppo` worker;
- `gc_off`: the same with Python's garbage collector frozen and off during the call;
- `threads_all`: torch's CPU threads set to every core;
- `pin_local`: every thread of the process kept on the cores of the GPU's own NUMA node (`rlpost.utils.numa`);
- `pin_remote`: the same on another node's cores (both refused, before the engine starts, on a host of one node);
- `sleep2`: before the (timed) call, the cycle `main_ppo`'s rollout runs before every generation when an actor
  shares its process: a level-2 sleep, the weights woken and loaded again in place, the KV cache woken;
- `tqdm`: vLLM's progress bar on, as `main_ppo`'s rank 0 generates (`VLLMRollout.generate_sequences`).

`--max-model-len` sets the engine's length (default prompt + response; `main_ppo` uses `data.max_prompt_length +
data.max_response_length`, 1024 for the GPU example).
`--engine-kwargs '{"async_scheduling": true}'` passes engine arguments on. Per repetition it records:
- wall seconds, and CPU-seconds per second of the process (every thread) and of the main thread; a thread that
  waits for the GPU spins under CUDA's default scheduling, so a share near 1 does not by itself say the work was
  CPU-bound (the GPU's utilization below does); the core (and its node) the main thread last ran on;
- a fixed pure-Python loop timed on the main thread just before and just after the call (`cpu_probe_*_ms`): if
  the core itself ran slower, the probe slows with the generation; and a 256 MiB copy (`mem_probe_*_gbs`), the
  memory bandwidth the core gets, which a busy neighbour on the same machine would lower;
- the process's user and system seconds, minor page faults, voluntary and involuntary context switches;
- the host's busy and steal shares of all cores (`/proc/stat`);
- the engine's scheduler steps: count, median / p90 / max milliseconds, and the seconds spent in steps longer than
  3x the median (stalls);
- from `nvidia-smi` sampled every 100 ms: SM clock (median, min), utilization, power, temperature, and the clock
  event reasons seen.

Then the correlation of wall time with each of these over all repetitions. Writes a JSON with every number.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.append(str(REPO))

from benchmarks.harness import cpu_probe_ms  # noqa: E402  (the one CPU probe; the name stays importable here)

VARIANTS = ("default", "gc_off", "threads_all", "pin_local", "pin_remote", "sleep2", "tqdm")
# /proc/stat's first line: cpu user nice system idle iowait irq softirq steal ...
_STAT_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
SMI_FIELDS = ("clocks.sm", "clocks.mem", "utilization.gpu", "power.draw", "temperature.gpu",
              "clocks_event_reasons.active")


def parse_proc_stat(text: str) -> dict[str, int]:
    """The all-cores line of /proc/stat as {field: jiffies}."""
    line = next(ln for ln in text.splitlines() if ln.startswith("cpu "))
    values = [int(v) for v in line.split()[1:1 + len(_STAT_FIELDS)]]
    return dict(zip(_STAT_FIELDS, values))


def host_shares(before: dict[str, int], after: dict[str, int]) -> dict[str, float]:
    """Busy (neither idle nor iowait nor steal) and steal shares of all cores between two /proc/stat reads."""
    delta = {k: after[k] - before[k] for k in before}
    total = sum(delta.values()) or 1
    busy = total - delta["idle"] - delta["iowait"] - delta["steal"]
    return {"host_busy": busy / total, "host_steal": delta["steal"] / total}


def memory_probe_gbs(mib: int = 256, reps: int = 3) -> float:
    """Fastest of `reps` copies of a `mib`-MiB buffer into another, in GB/s of bytes read + written: the host's
    memory bandwidth as this core sees it right now (a buffer far larger than any cache). The pure-Python probe
    above stays in the core's own caches; this one does not, so the two tell a slower core from a busier memory."""
    import numpy as np

    src = np.ones(mib * 2 ** 20, dtype=np.uint8)
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - start)
    return 2 * src.nbytes / best / 1e9


def rusage_delta(before: Any, after: Any) -> dict[str, float]:
    """User and system CPU seconds, page faults and context switches of the process between two getrusage reads:
    system time or faults that grow with the wall time point at the allocator, involuntary switches at another
    thread or process taking the core."""
    return {"user_s": after.ru_utime - before.ru_utime, "sys_s": after.ru_stime - before.ru_stime,
            "minor_faults": after.ru_minflt - before.ru_minflt,
            "vol_switches": after.ru_nvcsw - before.ru_nvcsw, "invol_switches": after.ru_nivcsw - before.ru_nivcsw}


def step_stats(durations: list[float]) -> dict[str, float]:
    """Count, median / p90 / max milliseconds of the scheduler steps, and the seconds in steps > 3x the median."""
    if not durations:
        return {"steps": 0, "step_median_ms": 0.0, "step_p90_ms": 0.0, "step_max_ms": 0.0, "stall_s": 0.0}
    ordered = sorted(durations)
    med = statistics.median(ordered)
    return {"steps": len(ordered), "step_median_ms": med * 1e3,
            "step_p90_ms": ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))] * 1e3,
            "step_max_ms": ordered[-1] * 1e3, "stall_s": sum(d for d in ordered if d > 3 * med)}


def window_stats(samples: list[tuple[float, dict[str, Any]]], start: float, end: float) -> dict[str, Any]:
    """The GPU samples taken between `start` and `end` (time.time()), summarized."""
    inside = [s for t, s in samples if start <= t <= end]
    out: dict[str, Any] = {"gpu_samples": len(inside)}
    if not inside:
        return out

    def col(name: str) -> list[float]:
        return [s[name] for s in inside if isinstance(s.get(name), float)]

    for name, key, fn in (("clocks.sm", "sm_clock_median_mhz", statistics.median),
                          ("clocks.sm", "sm_clock_min_mhz", min),
                          ("utilization.gpu", "gpu_util_mean", statistics.fmean),
                          ("power.draw", "power_mean_w", statistics.fmean),
                          ("temperature.gpu", "temp_max_c", max)):
        values = col(name)
        if values:
            out[key] = fn(values)
    reasons = sorted({s["clocks_event_reasons.active"] for s in inside if s.get("clocks_event_reasons.active")})
    out["clock_event_reasons"] = reasons
    return out


def pearson(xs: list[float], ys: list[float]) -> float | None:
    """Pearson's r (`statistics.correlation`), or None for fewer than 3 points or a side that does not vary."""
    if len(xs) < 3:
        return None
    try:
        return statistics.correlation(xs, ys)
    except statistics.StatisticsError:  # a constant side
        return None


def schedule(reps: int, variants: tuple[str, ...]) -> list[str]:
    """Round-robin over `variants`, the first one moving by one each round."""
    out = []
    for r in range(reps):
        k = r % len(variants)
        out += list(variants[k:] + variants[:k])
    return out


def correlations(records: list[dict[str, Any]]) -> dict[str, float | None]:
    """Pearson's r of wall seconds with every other numeric field, over the repetitions that have it (a window with
    no GPU sample has no clock). Labels and counts that follow the wall time by construction are left out."""
    skip = ("wall_s", "rep", "cpu_last", "node_last", "gpu_samples")
    keys = sorted({k for r in records for k, v in r.items() if isinstance(v, (int, float)) and k not in skip})
    out = {}
    for k in keys:
        having = [r for r in records if isinstance(r.get(k), (int, float))]
        out[k] = pearson([r["wall_s"] for r in having], [float(r[k]) for r in having])
    return out


class GpuSampler:
    """`nvidia-smi` every 100 ms in the background; `samples` is [(time.time(), {field: value})]."""

    def __init__(self, gpu: str) -> None:
        self.samples: list[tuple[float, dict[str, Any]]] = []
        fields = list(SMI_FIELDS)
        probe = subprocess.run(["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits",
                                "-i", gpu], capture_output=True, text=True)
        if probe.returncode != 0:  # an older driver names the last field clocks_throttle_reasons.active
            fields[-1] = "clocks_throttle_reasons.active"
        self.fields = fields
        self.proc = subprocess.Popen(["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits",
                                      "-lms", "100", "-i", gpu], stdout=subprocess.PIPE, text=True)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        for line in self.proc.stdout:  # type: ignore[union-attr]
            parts = [p.strip() for p in line.split(",")]
            if len(parts) != len(self.fields):
                continue
            row: dict[str, Any] = {}
            for name, value in zip(SMI_FIELDS, parts):
                try:
                    row[name] = float(value)
                except ValueError:
                    row[name] = value
            self.samples.append((time.time(), row))

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(5)


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    import bench_limits as bl
    from rlpost.utils import numa

    cuda = torch.cuda.is_available()
    if "sleep2" in args.variants and not cuda:
        raise SystemExit("bench_gen_variance: sleep2 needs a GPU (vLLM's sleep mode); leave it out of --variants")
    all_threads = os.cpu_count() or 1
    everywhere = os.sched_getaffinity(0)
    nodes = numa.node_cpus()
    node_of = {c: n for n, cpus in nodes.items() for c in cpus}
    local = numa.gpu_local_cpus(0) if cuda else set()
    remote = next((cpus for cpus in nodes.values() if not cpus & local), set()) if local else set()
    pins = {"pin_local": local, "pin_remote": remote}
    # a pin that is empty, or that is every core the process may use anyway, would time the default twice
    useless = [v for v in args.variants if v in pins and (not pins[v] or pins[v] >= everywhere)]
    if useless:
        raise SystemExit(f"bench_gen_variance: {useless} would not change where the process runs on this host "
                         f"(NUMA nodes {sorted(nodes)}, {len(local)} GPU-local cores of {len(everywhere)} allowed); "
                         f"leave them out of --variants")
    bl.ensure_model(args.model_dir, args.arch)
    vocab = json.loads((args.model_dir / "config.json").read_text())["vocab_size"]
    llm, engine_start_s = bl.bare_engine(args.model_dir, args.max_model_len or args.prompt_len + args.response_len,
                                         args.gpu_memory_utilization, enforce_eager=not cuda,
                                         max_num_seqs=args.max_num_seqs,
                                         max_num_batched_tokens=args.max_num_batched_tokens, **args.engine_kwargs)
    from vllm import SamplingParams

    prompts = bl.random_prompts(args.prompts, args.prompt_len, high=min(vocab, 150000))
    requests = [{"prompt_token_ids": row.tolist()} for row in prompts for _ in range(args.n)]
    params = SamplingParams(n=1, temperature=1.0, max_tokens=args.response_len, ignore_eos=True, detokenize=False)

    engine = llm.llm_engine
    step_times: list[float] = []
    inner_step = engine.step

    def timed_step(*a: Any, **kw: Any) -> Any:
        start = time.perf_counter()
        out = inner_step(*a, **kw)
        step_times.append(time.perf_counter() - start)
        return out

    engine.step = timed_step  # the instance attribute shadows the class's method for LLM._run_engine
    weights = bl.weights_on_gpu(args.model_dir) if cuda and "sleep2" in args.variants else {}

    def sleep_cycle() -> None:
        """rlpost's cycle: sleep level 2, wake the weights, load them in place, wake the KV cache."""
        llm.sleep(level=2)
        llm.wake_up(tags=["weights"])
        bl.load_in_place(llm, weights)
        llm.wake_up(tags=["kv_cache"])

    sched = getattr(getattr(llm.llm_engine, "vllm_config", None), "scheduler_config", None)
    sampler = GpuSampler(os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]) if cuda else None
    torch.set_num_threads(1)
    llm.generate(requests, params, use_tqdm=False)  # warm-up at full size
    records = []
    try:
        for rep, variant in enumerate(schedule(args.reps, args.variants)):
            torch.set_num_threads(all_threads if variant == "threads_all" else 1)
            numa.set_process_affinity(pins.get(variant, everywhere))
            probe0, mem0 = cpu_probe_ms(), memory_probe_gbs()  # before the cycle: the call follows it directly
            if variant == "sleep2":
                sleep_cycle()
            gc.collect()  # every variant starts from a collected heap
            if variant == "gc_off":
                gc.freeze()
                gc.disable()
            step_times.clear()
            stat0 = parse_proc_stat(Path("/proc/stat").read_text())
            ru0, th0 = resource.getrusage(resource.RUSAGE_SELF), time.thread_time()
            t0 = time.time()
            bl.sync()
            start = time.perf_counter()
            outs = llm.generate(requests, params, use_tqdm=variant == "tqdm")
            bl.sync()
            wall = time.perf_counter() - start
            t1 = time.time()
            th1, ru1 = time.thread_time(), resource.getrusage(resource.RUSAGE_SELF)
            stat1 = parse_proc_stat(Path("/proc/stat").read_text())
            probe1, mem1 = cpu_probe_ms(), memory_probe_gbs()
            if variant == "gc_off":
                gc.enable()
                gc.unfreeze()
            tokens = sum(len(c.token_ids) for o in outs for c in o.outputs)
            assert tokens == len(requests) * args.response_len, tokens
            cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
            core = numa.current_cpu()
            rec = {"rep": rep, "variant": variant, "wall_s": wall, "process_cpu_s": cpu,
                   "cpu_probe_before_ms": probe0, "cpu_probe_after_ms": probe1,
                   "mem_probe_before_gbs": mem0, "mem_probe_after_gbs": mem1, **rusage_delta(ru0, ru1),
                   "process_cpu_share": cpu / wall, "thread_cpu_share": (th1 - th0) / wall,
                   "cpu_last": core, "node_last": node_of.get(core, -1),
                   "load1": os.getloadavg()[0], **host_shares(stat0, stat1), **step_stats(step_times),
                   **(window_stats(sampler.samples, t0, t1) if sampler else {})}
            records.append(rec)
            print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in rec.items()}), flush=True)
    finally:
        if sampler:
            sampler.stop()
    by_variant = {}
    for v in args.variants:
        walls = [r["wall_s"] for r in records if r["variant"] == v]
        by_variant[v] = {"median_s": statistics.median(walls), "range_s": [min(walls), max(walls)], "reps": len(walls)}
    return {"env": bl.env_info(), "args": {k: str(v) for k, v in vars(args).items()},
            "engine_start_s": engine_start_s, "cpu_count": os.cpu_count(), "by_variant": by_variant,
            "numa_nodes": {n: len(c) for n, c in nodes.items()}, "gpu_local_cpus": sorted(local),
            "async_scheduling": getattr(sched, "async_scheduling", None),
            "correlation_with_wall": correlations(records), "records": records}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-dir", type=Path, required=True, help="built here when missing")
    ap.add_argument("--arch", choices=["0.5b", "7b"], default="0.5b")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--response-len", type=int, default=512)
    ap.add_argument("--reps", type=int, default=10, help="rounds; each runs every variant once")
    ap.add_argument("--variants", nargs="+", choices=VARIANTS, default=["default", "gc_off", "threads_all"])
    ap.add_argument("--engine-kwargs", type=json.loads, default={}, help="JSON object of extra engine arguments")
    ap.add_argument("--max-model-len", type=int, default=None, help="the engine's length (default prompt + response)")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.6)
    ap.add_argument("--max-num-seqs", type=int, default=1024)
    ap.add_argument("--max-num-batched-tokens", type=int, default=16384)
    ap.add_argument("--json-out", type=Path, default=None)
    args = ap.parse_args(argv)
    args.variants = tuple(args.variants)
    if "max_model_len" in args.engine_kwargs:
        ap.error("set the engine's length with --max-model-len, not in --engine-kwargs")
    if args.max_model_len is not None and args.max_model_len < args.prompt_len + args.response_len:
        ap.error(f"--max-model-len {args.max_model_len} is shorter than --prompt-len + --response-len "
                 f"({args.prompt_len + args.response_len}); use at least that")
    return args


def main() -> None:
    args = parse_args()
    res = run(args)
    print(json.dumps({k: res[k] for k in ("by_variant", "correlation_with_wall")}, indent=1))
    print(f"wrote {build_result(args, res).write(path=args.json_out)}")


def build_result(args: argparse.Namespace, res: dict[str, Any]) -> Any:
    """The harness result of `run`: each variant's wall time per generation (median, spread, every round) as a
    metric; the records, correlations and host facts kept as they were."""
    from benchmarks import harness

    res = dict(res)
    result = harness.Result("gen_variance", harness.command_line(), args.reps, env=res.pop("env"))
    for variant in res["by_variant"]:
        result.timing(f"wall_s_{variant}", [r["wall_s"] for r in res["records"] if r["variant"] == variant])
    result.extra.update({**res, "args": harness.params(args)})
    return result


if __name__ == "__main__":
    main()
