"""FSDP engine knobs: actor-update time and peak memory per setting, and the weight-sync gather per-tensor vs
bucketed.

    python benchmarks/bench_knobs.py --world 2 --reps 5                                  # GPU host, 2 GPUs
    python benchmarks/bench_knobs.py --world 1 --reps 5                                  # GPU host, 1 GPU (no sync)
    python benchmarks/bench_knobs.py --device cpu --tiny --world 2 --reps 2 --rows 2 --micro 2 \
        --prompt-len 8 --response-len 8

`--world` processes (torch.multiprocessing spawn; nccl on CUDA, gloo on CPU) each build one rlpost
`ActorRolloutRefWorker` (role "actor") per setting on a random-weight Qwen2.5-0.5B-architecture model (`--tiny`:
the test model), composed from the packaged `ppo_trainer` YAML (bf16 compute on CUDA, FSDP2 over all ranks):

    baseline            gradient checkpointing, fp32 master weights
    model_dtype_bf16    + actor.fsdp_config.model_dtype=bf16
    activation_offload  + model.enable_activation_offload=true
    forward_prefetch    + actor.fsdp_config.forward_prefetch=true
    no_ckpt             gradient checkpointing off
    no_ckpt_offload     gradient checkpointing off + activation offload

Every rank trains `--rows` fixed-length rows (`--prompt-len` + `--response-len`, micro-batch `--micro`) per
update, one optimizer step. After a warm-up, `--reps` timed updates alternate the settings; the idle workers
wait on the CPU, so each peak (torch.cuda.max_memory_allocated, max over ranks) is the setting's own.
With --world 2 the weight-sync gather (all parameters, full tensors in bf16, the rollout's dtype) is timed
per tensor (`full_tensor()` each) and bucketed (`--buckets` MB), alternating, `--reps` each, after a warm-up.
Writes one `benchmarks.harness` result, `benchmarks/results/<date>_<gpu|cpu>/knobs_x<world>.json` (or
`--json-out`): an `update_<setting>_s` and a `sync_<gather>_s` timing metric each (median, spread, every
repetition), the per-setting summaries under `results`; prints a table of medians.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.append(str(REPO))
sys.path.append(str(REPO / "benchmarks"))

from bench_ulysses import park, reduce_max, start_rank, timed_update, update_batch  # noqa: E402

from benchmarks import harness  # noqa: E402

ARR = "actor_rollout_ref"
SETTINGS: dict[str, tuple[str, ...]] = {
    "baseline": (),
    "model_dtype_bf16": (f"{ARR}.actor.fsdp_config.model_dtype=bf16",),
    "activation_offload": (f"{ARR}.model.enable_activation_offload=true",),
    "forward_prefetch": (f"{ARR}.actor.fsdp_config.forward_prefetch=true",),
    "no_ckpt": (f"{ARR}.model.enable_gradient_checkpointing=false",),
    "no_ckpt_offload": (f"{ARR}.model.enable_gradient_checkpointing=false",
                        f"{ARR}.model.enable_activation_offload=true"),
}


def worker_config(model_dir: Path, overrides: tuple[str, ...], args: argparse.Namespace) -> Any:
    """`actor_rollout_ref` of the packaged `ppo_trainer` with the benchmark's and the setting's overrides."""
    from hydra import compose, initialize_config_dir

    from rlpost.trainer.config import CONFIG_DIR, validate_config

    rows = args.rows * args.world  # the global mini-batch: one optimizer step per update
    over = [
        f"trainer.device={args.device}", f"trainer.n_gpus_per_node={args.world}", f"data.train_batch_size={rows}",
        f"data.max_prompt_length={args.prompt_len}", f"data.max_response_length={args.response_len}",
        f"{ARR}.model.path={model_dir}", f"{ARR}.model.enable_gradient_checkpointing=true",
        f"{ARR}.rollout.name=hf", f"{ARR}.rollout.tensor_model_parallel_size=1",
        f"{ARR}.actor.ppo_mini_batch_size={rows}", f"{ARR}.actor.ppo_micro_batch_size_per_gpu={args.micro}",
        f"critic.ppo_micro_batch_size_per_gpu={args.micro}", *overrides,
    ]
    if args.device == "cuda":
        over.append(f"{ARR}.actor.fsdp_config.mixed_precision.param_dtype=bf16")
    with initialize_config_dir(str(CONFIG_DIR), version_base=None):
        cfg = compose("ppo_trainer", overrides=over)
    return validate_config(cfg).actor_rollout_ref


def measure_updates(workers: dict[str, Any], vocab: int, rank: int, args: argparse.Namespace) -> dict[str, Any]:
    """Warm-up, then `args.reps` alternating timed updates of every setting."""
    batch = update_batch(args.rows, args.prompt_len, args.response_len, vocab, seed=rank)
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in workers}
    for rep in range(args.reps + 1):  # rep 0 is the warm-up
        for name, worker in workers.items():
            park(worker, args.device)
            res = timed_update(worker, batch, args.device)
            park(worker, "cpu")
            if res is None:
                raise RuntimeError(f"{name}: out of memory; lower --rows or --micro")
            if rep:
                runs[name].append(res)
    out = {}
    for name, rs in runs.items():
        out[name] = {**seconds_summary([r["s"] for r in rs]), "peak_GiB": max(r["peak_GiB"] for r in rs),
                     "grad_norm": rs[-1]["grad_norm"]}
    return out


def seconds_summary(secs: list[float]) -> dict[str, Any]:
    """Median, quartiles and range (harness.spread) of `secs`, with every value."""
    sp = harness.spread(secs)
    return {"s_median": sp["median"], "s_q1": sp["q1"], "s_q3": sp["q3"], "s_min": sp["min"], "s_max": sp["max"],
            "all_s": secs}


def timed_gather(module: torch.nn.Module, bucket_mb: int, device: str) -> dict[str, float]:
    """Consume `iter_full_params` (bf16) once: seconds (slowest rank) and peak memory above the start (GiB)."""
    import torch.distributed as dist

    from rlpost.engine.fsdp import iter_full_params

    cuda = device == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated() if cuda else 0
    def gather() -> float:
        checksum = 0.0
        for _, tensor in iter_full_params(module, torch.bfloat16, bucket_bytes=bucket_mb * 2**20):
            checksum += float(tensor[:1].float().sum())  # touch every tensor, as the engine's loader would
        return checksum

    dist.barrier()
    seconds, checksum = harness.timed(gather, torch.cuda.synchronize if cuda else None)
    extra = (torch.cuda.max_memory_allocated() - base) / 2**30 if cuda else 0.0
    seconds, extra = reduce_max([seconds, extra])
    return {"s": seconds, "extra_peak_GiB": extra, "checksum": checksum}


def measure_sync(worker: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Per-tensor (bucket 0) vs each bucket size, alternating, after one warm-up round; checksums must agree."""
    park(worker, args.device)
    sizes = [0, *args.buckets]
    runs: dict[int, list[dict[str, float]]] = {mb: [] for mb in sizes}
    for rep in range(args.reps + 1):
        for mb in sizes:
            res = timed_gather(worker.actor_module, mb, args.device)
            if rep:
                runs[mb].append(res)
    park(worker, "cpu")
    sums = {round(r["checksum"], 3) for rs in runs.values() for r in rs}
    if len(sums) != 1:
        raise RuntimeError(f"bucketed and per-tensor gathers differ: checksums {sums}")
    entries = len(worker.actor_module.state_dict())
    out: dict[str, Any] = {"entries": entries}
    for mb, rs in runs.items():
        out["per_tensor" if mb == 0 else f"bucket_{mb}MB"] = {
            **seconds_summary([r["s"] for r in rs]), "extra_peak_GiB": max(r["extra_peak_GiB"] for r in rs)}
    return out


def run_rank(rank: int, port: int, args: argparse.Namespace, tmp: str) -> None:
    """One of the `--world` processes: model (built by rank 0), a worker per setting; rank 0 writes JSON."""
    import torch.distributed as dist

    from rlpost.workers.fsdp_workers import ActorRolloutRefWorker

    model_dir, vocab = start_rank(rank, args.world, port, args.device, args.tiny, tmp)
    workers = {}
    for name in args.settings:
        workers[name] = ActorRolloutRefWorker(worker_config(model_dir, SETTINGS[name], args), role="actor")
        workers[name].init_model()
        park(workers[name], "cpu")
    results: dict[str, Any] = {"update": measure_updates(workers, vocab, rank, args)}
    if args.world > 1:
        results["sync"] = measure_sync(workers[args.settings[0]], args)
    if rank == 0:
        write_results(results, model_dir, args)
    dist.destroy_process_group()


def build_result(results: dict[str, Any], model: dict[str, Any], args: argparse.Namespace,
                 env: dict[str, Any] | None = None) -> harness.Result:
    """The harness result of `results` ({"update": per setting, "sync": per gather}) on the model of `model`
    (its config.json): one timing metric per setting and gather, ratios to the baseline beside them."""
    base = results["update"].get("baseline")
    if base is not None:
        for entry in results["update"].values():
            entry["s_over_baseline"] = entry["s_median"] / base["s_median"]
            entry["peak_over_baseline"] = entry["peak_GiB"] / base["peak_GiB"] if base["peak_GiB"] else None
    arch = "tiny (random weights)" if args.tiny else "Qwen2.5-0.5B (random weights)"
    res = harness.Result(f"knobs_x{args.world}", harness.command_line(), args.reps, env=env or harness.environment())
    for name, entry in results["update"].items():
        res.timing(f"update_{name}_s", entry["all_s"], peak_GiB=entry["peak_GiB"],
                   s_over_baseline=entry.get("s_over_baseline"))
    for name, entry in results.get("sync", {}).items():
        if name != "entries":
            res.timing(f"sync_{name}_s", entry["all_s"], extra_peak_GiB=entry["extra_peak_GiB"])
    res.extra.update(settings=harness.params(args), model={"arch": arch, **{
        k: model.get(k) for k in ("hidden_size", "num_hidden_layers", "vocab_size")}},
        knob_overrides={name: list(SETTINGS[name]) for name in args.settings}, results=results)
    return res


def write_results(results: dict[str, Any], model_dir: Path, args: argparse.Namespace) -> None:
    res = build_result(results, json.loads((model_dir / "config.json").read_text()), args)
    print(table(results))
    print(f"[knobs] wrote {res.write(path=args.json_out)}", flush=True)


def table(results: dict[str, Any]) -> str:
    lines = [f"{'setting':>20} {'update s (min-max)':>24} {'peak GiB':>9} {'x baseline s':>13}"]
    for name, r in results["update"].items():
        ratio = r.get("s_over_baseline")
        lines.append(f"{name:>20} {r['s_median']:>10.3f} ({r['s_min']:.3f}-{r['s_max']:.3f}) {r['peak_GiB']:>9.2f} "
                     f"{'' if ratio is None else f'{ratio:.3f}':>13}")
    for name, r in results.get("sync", {}).items():
        if name != "entries":
            lines.append(f"{'sync ' + name:>20} {r['s_median']:>10.3f} ({r['s_min']:.3f}-{r['s_max']:.3f}) "
                         f"{r['extra_peak_GiB']:>9.2f}")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world", type=int, default=2, choices=(1, 2), help="processes / GPUs")
    ap.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    ap.add_argument("--rows", type=int, default=16, help="rows per rank per update")
    ap.add_argument("--micro", type=int, default=8, help="micro-batch rows")
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--response-len", type=int, default=512)
    ap.add_argument("--buckets", type=int, nargs="+", default=[512, 64], help="bucket sizes (MB) of the sync")
    ap.add_argument("--reps", type=int, default=5, help="timed repetitions after one warm-up")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--tiny", action="store_true", help="rlpost's tiny test model instead of the 0.5B one")
    ap.add_argument("--json-out", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.device == "cuda" and torch.cuda.device_count() < args.world:
        ap.error(f"--world {args.world} needs {args.world} GPUs, found {torch.cuda.device_count()}")
    return args


def main(argv: list[str] | None = None) -> None:
    import torch.multiprocessing as mp

    from rlpost.utils.distributed import free_port

    args = parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(run_rank, args=(free_port(), args, tmp), nprocs=args.world, join=True)


if __name__ == "__main__":
    main()
