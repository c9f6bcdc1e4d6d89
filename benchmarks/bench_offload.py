"""param_offload between phases, one GPU: rlpost's `offload_model` / `load_model_to` (pinned host copies)
against the plain `module.to("cpu")` / `module.to("cuda")` they replaced, alternated, on an FSDP2-sharded stack
of bf16 linear layers of a 7B model's shard size on 4 GPUs (~3.8 GB).

    python3 benchmarks/bench_offload.py --gb 3.8 --reps 5 --json-out /tmp/offload_h100.json

Reports the median (and range) of the offload (to host) and onload (back) seconds of each, and checks that the
parameters come back bit-identical. Needs torch with CUDA (and omegaconf for rlpost's imports). Writes one
`benchmarks.harness` result, `benchmarks/results/<date>_<gpu>/offload.json` (or `--json-out`): a
`<mode>_<offload|onload>_s` timing metric each, the old summary (sizes, medians, ranges) under `offload`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import harness  # noqa: E402
from rlpost.engine.fsdp import load_model_to, offload_model  # noqa: E402


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


def plain_offload(model: torch.nn.Module) -> None:
    model.to("cpu")


def plain_onload(model: torch.nn.Module, device: str) -> None:
    model.to(device)


def build_result(args: argparse.Namespace, nbytes: int, times: dict[str, dict[str, list[float]]],
                 env: dict[str, Any] | None = None) -> harness.Result:
    """The harness result of `times` (mode -> direction -> seconds per repetition) for `nbytes` of parameters."""
    res = harness.Result("offload", harness.command_line(), args.reps, env=env or harness.environment())
    for mode, directions in times.items():
        for direction, secs in directions.items():
            res.timing(f"{mode}_{direction}_s", secs)
    res.extra.update(args=harness.params(args), offload={
        "gb": nbytes / 2**30, "seconds": times,
        "median_s": {m: {k: statistics.median(v) for k, v in t.items()} for m, t in times.items()},
        "range_s": {m: {k: [min(v), max(v)] for k, v in t.items()} for m, t in times.items()}})
    return res


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gb", type=float, default=3.8)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json-out", type=Path, default=None)
    args = ap.parse_args(argv)
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
            times[name]["offload"].append(harness.timed(partial(off, model), torch.cuda.synchronize)[0])
            assert all(p.device.type == "cpu" for p in model.parameters())
            times[name]["onload"].append(harness.timed(partial(on, model, "cuda"), torch.cuda.synchronize)[0])
            assert checksum(model) == reference, f"{name}: parameters changed in the round trip"
    res = build_result(args, nbytes, times)
    summary = res.extra["offload"]
    for m, t in summary["median_s"].items():
        print(f"{m:7s} offload {t['offload']:.3f} s  onload {t['onload']:.3f} s  "
              f"({nbytes / 2**30:.2f} GiB; ranges {summary['range_s'][m]})")
    print(f"wrote {res.write(path=args.json_out)}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
