"""param_offload between phases, one GPU: rlpost's `offload_model` / `load_model_to` (pinned host copies)
against the plain `module.to("cpu")` / `module.to("cuda")` they replaced, alternated, on an FSDP2-sharded stack
of bf16 linear layers of a 7B model's shard size on 4 GPUs (~3.8 GB).

    python3 benchmarks/bench_offload.py --gb 3.8 --reps 5 --json-out /tmp/offload_h100.json

Reports the median (and range) of the offload (to host) and onload (back) seconds of each, and checks that the
parameters come back bit-identical. Needs torch with CUDA (and omegaconf for rlpost's imports).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

from rlpost.engine.fsdp import load_model_to, offload_model


def build(gb: float, width: int = 4096) -> torch.nn.Module:
    layers = max(1, round(gb * 2**30 / (width * width * 2)))
    model = torch.nn.Sequential(*(torch.nn.Linear(width, width, bias=False) for _ in range(layers)))
    model.to(device="cuda", dtype=torch.bfloat16)
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    return model


def checksum(model: torch.nn.Module) -> float:
    return float(sum(p.to_local().float().sum().item() for p in model.parameters()))


def timed(fn, model: torch.nn.Module, *args) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    fn(model, *args)
    torch.cuda.synchronize()
    return time.perf_counter() - start


def plain_offload(model: torch.nn.Module) -> None:
    model.to("cpu")


def plain_onload(model: torch.nn.Module, device: str) -> None:
    model.to(device)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gb", type=float, default=3.8)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json-out", type=Path, default=None)
    args = ap.parse_args()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    dist.init_process_group("nccl", rank=0, world_size=1)
    torch.cuda.set_device(0)
    model = build(args.gb)
    nbytes = sum(p.to_local().numel() * p.element_size() for p in model.parameters())
    reference = checksum(model)
    modes = {"plain": (plain_offload, plain_onload), "rlpost": (offload_model, load_model_to)}
    times: dict[str, dict[str, list[float]]] = {m: {"offload": [], "onload": []} for m in modes}
    for _ in range(args.reps):
        for name, (off, on) in modes.items():  # alternated, so drifts hit both alike
            times[name]["offload"].append(timed(off, model))
            assert all(p.device.type == "cpu" for p in model.parameters())
            times[name]["onload"].append(timed(on, model, "cuda"))
            assert checksum(model) == reference, f"{name}: parameters changed in the round trip"
    result = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "gb": nbytes / 2**30,
              "reps": args.reps, "command": "benchmarks/bench_offload.py " + " ".join(f"--{k.replace('_', '-')} {v}"
                                                                             for k, v in vars(args).items()),
              "seconds": times,
              "median_s": {m: {k: statistics.median(v) for k, v in t.items()} for m, t in times.items()},
              "range_s": {m: {k: [min(v), max(v)] for k, v in t.items()} for m, t in times.items()}}
    for m, t in result["median_s"].items():
        print(f"{m:7s} offload {t['offload']:.3f} s  onload {t['onload']:.3f} s  "
              f"({nbytes / 2**30:.2f} GiB; ranges {result['range_s'][m]})")
    if args.json_out:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps(result, indent=1))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
