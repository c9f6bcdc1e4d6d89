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
Writes one `benchmarks.harness` result, `benchmarks/results/<date>_cpu/dispatch.json` (or --json-out): a
`<side>_x<ranks>_s` timing metric per side and rank count (median, spread, every repetition), the rows under
`results`. CPU only: Ray with a worker process per rank.
"""

from __future__ import annotations

import argparse
import sys
from functools import partial
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.append(str(REPO))  # after PYTHONPATH: a snapshot of rlpost put there wins
sys.path.append(str(REPO / "benchmarks"))

from benchmarks import harness  # noqa: E402
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


def side_summary(ts: list[float]) -> dict[str, Any]:
    """One side's repetitions: median, quartiles, range (harness.spread) and every time, in seconds."""
    sp = harness.spread(ts)
    return {"median_s": sp["median"], "q1_s": sp["q1"], "q3_s": sp["q3"], "min_s": sp["min"], "max_s": sp["max"],
            "all_s": ts}


def build_result(args: argparse.Namespace, results: list[dict[str, Any]], env: dict[str, Any] | None = None
                 ) -> harness.Result:
    """The harness result of the rows of every rank count: one timing metric per side and rank count."""
    res = harness.Result("dispatch", harness.command_line(), args.reps, env=env or harness.environment())
    for row in results:
        for side in SIDES:
            res.timing(f"{side}_x{row['ranks']}_s", row[side]["all_s"], rows=row["rows"],
                       input_bytes=row["input_bytes"])
    res.extra.update(args=harness.params(args), results=results)
    return res


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--rows-per-rank", type=int, default=512)
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--response-len", type=int, default=512)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json-out", type=Path, default=None)
    args = ap.parse_args(argv)
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
                    elapsed, out = harness.timed(partial(wg.compute_log_prob, empty if side == "empty" else full))
                    assert tuple(out.batch["old_log_probs"].shape) == (rows, args.response_len), side
                    if rep:
                        times[side].append(elapsed)
            set_wire("numpy")
            row = {"ranks": ranks, "rows": rows, "input_bytes": full.nbytes()[0]}
            for side, ts in times.items():
                row[side] = side_summary(ts)
            results.append(row)
            print(f"[dispatch] {ranks} rank(s), {rows} rows ({row['input_bytes'] / 2**20:.1f} MiB in): " + ", ".join(
                f"{side} {row[side]['median_s'] * 1e3:.0f} ms [{row[side]['min_s'] * 1e3:.0f}, "
                f"{row[side]['max_s'] * 1e3:.0f}]" for side in SIDES), flush=True)
            wg.shutdown()  # its CPUs go back to the pool for the next rank count
    finally:
        finish_ray()
    print(f"[dispatch] wrote {build_result(args, results).write(path=args.json_out)}", flush=True)


if __name__ == "__main__":
    main()
