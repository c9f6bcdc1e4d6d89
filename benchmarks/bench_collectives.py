"""FSDP's collectives alone on this host: all-gather and reduce-scatter at the sizes one training step of
the 0.5B model issues, on 2..N GPUs (issue 18 §7: what grows with the GPU count).

    python3 benchmarks/bench_collectives.py --world-sizes 2 4 --json-out benchmarks/results/collectives.json

Sizes: the whole model as one FSDP unit (`--params`, default Qwen2.5-0.5B's 494M: the bf16 all-gather of every
parameter, the fp32 reduce-scatter of every gradient) and one decoder layer of it (`--layer-params`, default 14.9M).
Each call is timed `--reps` times after two warm-ups, all ranks starting behind a barrier; a repetition's time is
the slowest rank's. Medians and ranges in ms, and the bus bandwidth size x (world - 1) / world / time.
`--backend gloo --device cpu` runs the same on CPU (tests). Writes one `benchmarks.harness` result,
`benchmarks/results/<date>_<gpu|cpu>/collectives.json` (or `--json-out`): a `<name>_x<world>_ms` timing metric per
collective and world size (median, spread, every repetition), the rows under `results`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import harness  # noqa: E402


def _sizes(params: int, layer_params: int) -> list[tuple[str, str, int, torch.dtype]]:
    """(name, op, elements of the unsharded tensor, dtype)."""
    return [("model all-gather bf16", "all_gather", params, torch.bfloat16),
            ("model reduce-scatter fp32", "reduce_scatter", params, torch.float32),
            ("layer all-gather bf16", "all_gather", layer_params, torch.bfloat16),
            ("layer reduce-scatter fp32", "reduce_scatter", layer_params, torch.float32)]


def _timed_calls(op: str, full: torch.Tensor, shard: torch.Tensor, reps: int, cuda: bool) -> list[float]:
    """Milliseconds of `reps` calls of `op` after two warm-ups, each started together behind a barrier; each
    repetition's time is the slowest rank's."""
    def call() -> None:
        if op == "all_gather":
            dist.all_gather_into_tensor(full, shard)
        else:
            dist.reduce_scatter_tensor(shard, full)

    times = []
    for i in range(reps + 2):
        dist.barrier()
        s, _ = harness.timed(call, torch.cuda.synchronize if cuda else None)
        if i >= 2:
            times.append(s * 1e3)
    slowest = torch.tensor(times, dtype=torch.float64, device=full.device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return slowest.tolist()


def _worker(rank: int, world: int, args: argparse.Namespace, port: int, out: str) -> None:
    warnings.filterwarnings("ignore", category=FutureWarning)  # newer torch deprecates the two calls' names
    cuda = args.device == "cuda"
    dev = torch.device("cuda", rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(dev)
    dist.init_process_group(args.backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    rows = []
    for name, op, numel, dtype in _sizes(args.params, args.layer_params):
        numel -= numel % world
        full = torch.ones(numel, dtype=dtype, device=dev)
        shard = torch.ones(numel // world, dtype=dtype, device=dev)
        times = _timed_calls(op, full, shard, args.reps, cuda)
        nbytes = numel * full.element_size()
        med = statistics.median(times)
        rows.append({"name": name, "bytes": nbytes, "ms": med, "ms_range": [min(times), max(times)], "ms_all": times,
                     "bus_gb_per_s": nbytes * (world - 1) / world / (med / 1e3) / 1e9})
        del full, shard
    if rank == 0:
        Path(out).write_text(json.dumps(rows))
    dist.destroy_process_group()


def build_result(args: argparse.Namespace, results: list[dict[str, Any]], env: dict[str, Any] | None = None
                 ) -> harness.Result:
    """The harness result of the rows of every world size: one timing metric (ms) per collective and world."""
    res = harness.Result("collectives", harness.command_line(), args.reps, env=env or harness.environment())
    for row in results:
        res.timing(f"{row['name'].replace(' ', '_').replace('-', '_')}_x{row['world']}_ms", row["ms_all"], unit="ms",
                   bytes=row["bytes"], bus_gb_per_s=row["bus_gb_per_s"])
    res.extra.update(args=harness.params(args), results=results)
    return res


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world-sizes", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--params", type=int, default=494_032_768)
    ap.add_argument("--layer-params", type=int, default=14_912_384, help="one decoder layer (Qwen2.5-0.5B's)")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--backend", default="nccl")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--json-out", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.reps < 1:
        ap.error("--reps must be at least 1")
    from rlpost.utils.distributed import free_port

    results = []
    for world in args.world_sizes:
        out = f"/tmp/bench_collectives_{os.getpid()}_{world}.json"
        mp.spawn(_worker, args=(world, args, free_port(), out), nprocs=world, join=True)
        for row in json.loads(Path(out).read_text()):
            row["world"] = world
            results.append(row)
            print(f"[collectives] {world} ranks {row['name']}: {row['ms']:.2f} ms "
                  f"[{row['ms_range'][0]:.2f}, {row['ms_range'][1]:.2f}], {row['bus_gb_per_s']:.1f} GB/s", flush=True)
        os.unlink(out)
    print(f"wrote {build_result(args, results).write(path=args.json_out)}")


if __name__ == "__main__":
    main()
