"""Start-up load of a sharded model: every rank reads the checkpoint (plain) against rank 0 alone reading it and
broadcasting the shards (`rlpost.utils.model.load_for_sharding` + `rlpost.engine.fsdp.load_shards_from_rank0`,
what the actor/critic/ref workers do with several ranks and untied embeddings).

    python3 benchmarks/bench_rank0_load.py --gpus 2 --reps 5 --json-out benchmarks/results/rank0_load.json

Each repetition spawns fresh processes (one per GPU, FSDP2 over nccl) and runs one mode, plain and rank-0
alternating; per rank it records the seconds from the spawned process's start (torch already imported) to the
sharded fp32 model on the GPU, and the process's peak resident host memory (ru_maxrss, in GiB). The two modes'
local shards are compared by checksum.
Medians and ranges over the repetitions of each mode are printed and written as one `benchmarks.harness` result,
`benchmarks/results/<date>_<gpu|cpu>/rank0_load.json` (or `--json-out`): `<mode>_slowest_rank_s` and
`<mode>_peak_rss_gib` metrics (median, spread, every repetition), the runs and summary under `runs`/`summary`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp

REPO = Path(__file__).resolve().parents[1]
sys.path.append(str(REPO))  # after PYTHONPATH: a snapshot of rlpost put there wins
sys.path.append(str(REPO / "benchmarks"))

from benchmarks import harness  # noqa: E402


def _rank(rank: int, world: int, port: int, model_dir: str, mode: str, device: str, out: Any) -> None:
    t0 = time.perf_counter()
    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    import resource

    from omegaconf import OmegaConf

    from rlpost.utils.distributed import init_distributed
    from rlpost.engine.fsdp import apply_fsdp2, load_shards_from_rank0
    from rlpost.utils.model import load_for_sharding, load_model

    init_distributed(device)
    cfg = OmegaConf.load(REPO / "rlpost/trainer/config/model/hf_model.yaml")
    cfg.path = model_dir  # the packaged defaults of actor_rollout_ref.model otherwise
    kwargs = dict(fsdp_size=-1, reshard_after_forward=True, offload_policy=False, min_num_params=0)
    if mode == "plain":
        model = apply_fsdp2(load_model(cfg, torch.float32), device, **kwargs)
    else:
        module, full = load_for_sharding(cfg, torch.float32)
        model = apply_fsdp2(module, device, **kwargs)
        load_shards_from_rank0(model, full)
        del full
    if device == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    checksum = sum(p.to_local().double().sum().item() for p in model.parameters())
    out[rank] = {"seconds": seconds, "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
                 "checksum": checksum}
    import torch.distributed as dist

    dist.barrier()
    dist.destroy_process_group()


def run(model_dir: str, world: int, mode: str, device: str) -> list[dict[str, float]]:
    from rlpost.utils.distributed import free_port

    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_rank, args=(world, free_port(), model_dir, mode, device, out), nprocs=world, join=True)
        return [dict(out[r]) for r in range(world)]


def summarize(runs: dict[str, list[list[dict[str, float]]]], gpus: int) -> dict[str, Any]:
    """Per mode: the slowest rank's seconds and the ranks' summed peak RSS over repetitions; whether the two
    modes' shards match by checksum."""
    summary: dict[str, Any] = {}
    for mode, reps in runs.items():
        slowest = [max(r["seconds"] for r in ranks) for ranks in reps]
        rss_sum = [sum(r["peak_rss_gib"] for r in ranks) for ranks in reps]
        summary[mode] = {"seconds_slowest_rank_median": statistics.median(slowest),
                         "seconds_range": [min(slowest), max(slowest)], "seconds_slowest_rank": slowest,
                         "peak_rss_gib_all_ranks_median": statistics.median(rss_sum), "peak_rss_gib_all_ranks": rss_sum,
                         "peak_rss_gib_per_rank_median": [statistics.median(ranks[i]["peak_rss_gib"] for ranks in reps)
                                                         for i in range(gpus)]}
    summary["same_shards"] = all(
        abs(a["checksum"] - b["checksum"]) <= 1e-9 * max(1.0, abs(a["checksum"]))
        for pr, rr in zip(runs["plain"], runs["rank0"]) for a, b in zip(pr, rr))
    return summary


def build_result(args: argparse.Namespace, config: dict[str, Any], runs: dict[str, Any],
                 env: dict[str, Any] | None = None) -> harness.Result:
    """The harness result of `runs` (mode -> repetition -> rank records) for the model of `config`."""
    summary = summarize(runs, args.gpus)
    res = harness.Result("rank0_load", harness.command_line(), args.reps, env=env or harness.environment())
    for mode in runs:
        res.timing(f"{mode}_slowest_rank_s", summary[mode]["seconds_slowest_rank"])
        res.timing(f"{mode}_peak_rss_gib", summary[mode]["peak_rss_gib_all_ranks"], unit="GiB")
    res.extra.update(args=harness.params(args), model=config.get("architectures"),
                     hidden_size=config.get("hidden_size"), num_hidden_layers=config.get("num_hidden_layers"),
                     gpus=args.gpus, runs=runs, summary=summary)
    return res


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=2, help="ranks (one per GPU; processes on CPU)")
    ap.add_argument("--model-dir", type=Path, default=Path("/tmp/m_7b"),
                    help="an untied model; built with Qwen2.5-7B's architecture (random weights) if absent")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json-out", type=Path, default=None)
    args = ap.parse_args(argv)
    import bench_limits

    model_dir = args.model_dir
    if not (model_dir / "config.json").exists():
        bench_limits.build_model(model_dir, arch="7b")
    config = json.loads((model_dir / "config.json").read_text())
    if config.get("tie_word_embeddings", False):
        sys.exit(f"{model_dir}: tied embeddings, the rank-0 path does not apply")
    runs: dict[str, list[list[dict[str, float]]]] = {"plain": [], "rank0": []}
    for rep in range(args.reps):
        for mode in ("plain", "rank0") if rep % 2 == 0 else ("rank0", "plain"):
            ranks = run(str(model_dir), args.gpus, mode, args.device)
            runs[mode].append(ranks)
            print(f"rep {rep} {mode:5s} " + "  ".join(
                f"rank {i}: {r['seconds']:.1f} s, peak RSS {r['peak_rss_gib']:.1f} GiB" for i, r in enumerate(ranks)),
                flush=True)
    res = build_result(args, config, runs)
    print(json.dumps(res.extra["summary"], indent=1))
    print(f"wrote {res.write(path=args.json_out)}")


if __name__ == "__main__":
    main()
