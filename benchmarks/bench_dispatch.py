"""The driver's cost of one `DP_COMPUTE_PROTO` call at main_ppo's sizes: a batch split over 1, 2 and 4 ranks and
the log-probs gathered back, against the same call carrying no input tensors.

    python benchmarks/bench_dispatch.py                          # 64 x 8 rows per rank, 512 + 512 tokens, 5 reps
    python benchmarks/bench_dispatch.py --ranks 1 2 --rows-per-rank 16 --reps 2     # smoke test

Each rank's worker returns (rows, response) log-probs and entropies at once, so the time is the driver's split and
serialisation, Ray's transfer, the workers' deserialisation and the gather: what grows with the GPU count in a
weak-scaling run apart from the GPUs' own work. Three sides, alternated repetition by repetition:
  numpy  - DataProto's wire format (CPU tensors pickled as numpy arrays, buffers out of band);
  torch  - the format before it (tensors pickled by torch's storage reducer, views compacted), both ways;
  empty  - the same call with a DataProto of no input tensors (Ray's cost of a call per rank, plus the answer).
Writes `benchmarks/results/dispatch_<host>.json` (or --json-out). CPU only: Ray with a worker process per rank.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.append(str(REPO))  # after PYTHONPATH: a snapshot of rlpost put there wins
sys.path.append(str(REPO / "benchmarks"))

import bench_limits  # noqa: E402

from rlpost import protocol, protocol_utils  # noqa: E402
from rlpost.protocol import DataProto  # noqa: E402
from rlpost.single_controller.base import Dispatch, Worker, register  # noqa: E402
from rlpost.single_controller.ray import (RayClassWithInitArgs, RayResourcePool, RayWorkerGroup,  # noqa: E402
                                          finish_ray, init_ray)

SIDES = ("numpy", "torch", "empty")
_NUMPY_WIRE = protocol.to_wire  # the name DataProto's pickling calls


def set_wire(side: str) -> None:
    """DataProto's pickling in this process: numpy arrays (the wire format) or torch storages (the one before)."""
    protocol.to_wire = _NUMPY_WIRE if side != "torch" else protocol_utils._compact


class LogProbEcho(Worker):
    """Answers a log-prob call at once with (rows, response) float32 log-probs and entropies."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def set_wire(self, side: str) -> None:
        set_wire(side)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_log_prob(self, data: DataProto) -> DataProto:
        rows = len(data) if data.batch else data.meta_info["rows"]
        response = data.meta_info["response"]
        return DataProto.from_dict(tensors={"old_log_probs": torch.zeros(rows, response),
                                            "entropys": torch.zeros(rows, response)})


def log_prob_input(rows: int, prompt: int, response: int) -> DataProto:
    """What main_ppo sends to old_log_prob: the rollout's tensors (int64 ids, masks, float rewards)."""
    seq = prompt + response
    ids = torch.randint(0, 150000, (rows, seq))
    tensors = {"prompts": ids[:, :prompt].clone(), "responses": ids[:, prompt:].clone(), "input_ids": ids,
               "attention_mask": torch.ones(rows, seq, dtype=torch.int64),
               "position_ids": torch.arange(seq).expand(rows, seq).clone(),
               "response_mask": torch.ones(rows, response, dtype=torch.int64),
               "token_level_scores": torch.zeros(rows, response)}
    return DataProto.from_dict(tensors=tensors, meta_info={"response": response})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--rows-per-rank", type=int, default=512)
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--response-len", type=int, default=512)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json-out", type=Path, default=None)
    args = ap.parse_args()
    init_ray({"num_cpus": sum(args.ranks)}, verbose=False)  # each group keeps its placement group
    results = []
    try:
        for ranks in args.ranks:
            wg = RayWorkerGroup(RayResourcePool([ranks], use_gpu=False), RayClassWithInitArgs(LogProbEcho))
            rows = args.rows_per_rank * ranks
            full = log_prob_input(rows, args.prompt_len, args.response_len)
            empty = DataProto(meta_info={"rows": args.rows_per_rank, "response": args.response_len})
            times: dict[str, list[float]] = {side: [] for side in SIDES}
            for rep in range(args.reps + 1):  # the first round warms up
                for side in SIDES:
                    set_wire(side)
                    wg.set_wire(side)
                    start = time.perf_counter()
                    out = wg.compute_log_prob(empty if side == "empty" else full)
                    elapsed = time.perf_counter() - start
                    assert tuple(out.batch["old_log_probs"].shape) == (rows, args.response_len), side
                    if rep:
                        times[side].append(elapsed)
            set_wire("numpy")
            row = {"ranks": ranks, "rows": rows, "input_bytes": full.nbytes()[0]}
            for side, ts in times.items():
                row[side] = {"median_s": statistics.median(ts), "min_s": min(ts), "max_s": max(ts), "all_s": ts}
            results.append(row)
            print(f"[dispatch] {ranks} rank(s), {rows} rows ({row['input_bytes'] / 2**20:.1f} MiB in): " + ", ".join(
                f"{side} {row[side]['median_s'] * 1e3:.0f} ms [{row[side]['min_s'] * 1e3:.0f}, "
                f"{row[side]['max_s'] * 1e3:.0f}]" for side in SIDES), flush=True)
            wg.shutdown()  # its CPUs go back to the pool for the next rank count
    finally:
        finish_ray()
    out_path = args.json_out or REPO / "benchmarks" / "results" / f"dispatch_{platform.node() or 'host'}.json"
    env = {**bench_limits.env_info(), "cpus": os.cpu_count(), "python": platform.python_version()}
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps({"env": env, "args": {k: str(v) for k, v in vars(args).items()},
                                    "results": results}, indent=1))
    print(f"[dispatch] wrote {out_path}", flush=True)


if __name__ == "__main__":
    main()
