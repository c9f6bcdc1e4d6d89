"""Ulysses sequence parallelism on 2 GPUs: actor-update tokens/s and peak memory per GPU, SP=1 vs SP=2.

    python benchmarks/bench_ulysses.py --lengths 4096 16384 32768 65536 --reps 5    # GPU host, 2 GPUs, no vLLM
    python benchmarks/bench_ulysses.py --device cpu --tiny --lengths 64 --reps 2     # CPU smoke test (gloo)

Two processes (torch.multiprocessing spawn; nccl on CUDA, gloo on CPU) each build two rlpost
`ActorRolloutRefWorker`s (role "actor") on a random-weight Qwen2.5-0.5B-architecture model, composed from the
packaged `ppo_trainer` YAML (remove-padding, gradient checkpointing, bf16 compute, FSDP2 over both devices):
one with `actor.ulysses_sequence_parallel_size=1` (2 data-parallel ranks), one with 2 (one group of 2).
Every rank receives `--rows` fixed-length rows of `--prompt-len` + L random tokens per update (one optimizer
step), so both settings train the same tokens per update; an SP=2 group gathers its ranks' rows. SP=1 runs
micro-batches of 1 row; SP=2 micro-batches of `--sp-micro` rows (default 2: one packed row of both ranks' rows,
cut in 2 slices, i.e. the same tokens per device per forward as SP=1; 1 = two forwards of half a row each).

For each L (ascending) and setting: a warm-up update, then `--reps` timed updates, alternating the settings.
The idle worker's parameters and AdamW state wait on the CPU, so a setting's peak memory
(`rlpost.utils.profiler.block_peak` around the update, max over ranks) is its own. tokens/s per GPU counts
prompt + response tokens of all rows over the slowest rank's time, divided by the 2 devices. An out-of-memory
error (on any rank) is recorded as {"oom": true}; that worker is dropped and its longer lengths are not tried.
Writes one `benchmarks.harness` result, `benchmarks/results/<date>_<gpu|cpu>/ulysses.json` (or `--json-out`): an
`L<length>_sp<size>_update_s` timing metric per length and setting (median, spread, every update; slowest rank),
the per-length summaries under `results`; prints a table.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.append(str(REPO))
sys.path.append(str(REPO / "benchmarks"))

import bench_limits  # noqa: E402

from benchmarks import harness  # noqa: E402
from rlpost import keys  # noqa: E402
from rlpost.protocol import DataProto  # noqa: E402
from rlpost.utils.profiler import block_peak  # noqa: E402

WORLD = 2
SIZES = (1, 2)


def worker_config(model_dir: Path, sp: int, args: argparse.Namespace) -> Any:
    """`actor_rollout_ref` of the packaged `ppo_trainer` composed with the benchmark's overrides, validated."""
    from hydra import compose, initialize_config_dir

    from rlpost.trainer.config import CONFIG_DIR, validate_config

    rows = args.rows * WORLD  # the global mini-batch: one optimizer step per update
    over = [
        f"trainer.device={args.device}", f"trainer.n_gpus_per_node={WORLD}", f"data.train_batch_size={rows}",
        f"data.max_prompt_length={args.prompt_len}", f"data.max_response_length={max(args.lengths)}",
        f"actor_rollout_ref.model.path={model_dir}", "actor_rollout_ref.model.use_remove_padding=true",
        "actor_rollout_ref.model.enable_gradient_checkpointing=true", "actor_rollout_ref.rollout.name=hf",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        f"actor_rollout_ref.actor.ulysses_sequence_parallel_size={sp}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={rows}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={args.sp_micro if sp > 1 else 1}",
        "critic.ppo_micro_batch_size_per_gpu=1",  # checked against the same mini-batch, though unused
        *args.override,
    ]
    if args.device == "cuda":
        over.append("actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=bf16")
    with initialize_config_dir(str(CONFIG_DIR), version_base=None):
        cfg = compose("ppo_trainer", overrides=over)
    return validate_config(cfg).actor_rollout_ref


def update_batch(rows: int, prompt_len: int, response_len: int, vocab: int, seed: int) -> DataProto:
    """`rows` fixed-length rows of random tokens, as the rollout returns them, with old log-probs at the
    uniform policy's value and random advantages."""
    g = torch.Generator().manual_seed(seed)
    t = prompt_len + response_len
    ids = torch.randint(10, vocab, (rows, t), generator=g)
    return DataProto.from_dict(tensors={
        keys.INPUT_IDS: ids, keys.ATTENTION_MASK: torch.ones(rows, t, dtype=torch.long),
        keys.POSITION_IDS: torch.arange(t).expand(rows, t).clone(), keys.RESPONSES: ids[:, prompt_len:],
        keys.RESPONSE_MASK: torch.ones(rows, response_len, dtype=torch.long),
        keys.OLD_LOG_PROBS: torch.full((rows, response_len), -math.log(vocab)),
        keys.ADVANTAGES: torch.randn(rows, response_len, generator=g)})


def park(worker: Any, device: str) -> None:
    """Move the worker's sharded parameters and AdamW state to `device` ('cpu' while the other one runs)."""
    from rlpost.engine.fsdp import load_model_to, move_optimizer, offload_model

    if device == "cpu":
        offload_model(worker.actor_module)
    else:
        load_model_to(worker.actor_module, device)
    move_optimizer(worker.actor_optimizer, device)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def reduce_max(values: list[float]) -> list[float]:
    """Element-wise max over ranks (CPU tensor: the gloo side of the default group)."""
    import torch.distributed as dist

    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def timed_update(worker: Any, batch: DataProto, device: str) -> dict[str, float] | None:
    """One `update_actor`: seconds (slowest rank), peak and resident memory (GiB, max over ranks), grad norm;
    None when any rank ran out of memory."""
    import torch.distributed as dist

    cuda = device == "cuda"
    if cuda:
        torch.cuda.synchronize()
    resident = torch.cuda.memory_allocated() / 2**30 if cuda else 0.0
    def update() -> tuple[float, float]:
        """(1.0 when this rank ran out of memory else 0.0, the update's last grad norm)."""
        try:
            metrics = worker.update_actor(batch).meta_info[keys.META_METRICS]
        except torch.cuda.OutOfMemoryError:
            return 1.0, float("nan")
        norms = metrics["actor/grad_norm"]
        return 0.0, float(norms[-1] if isinstance(norms, list) else norms)

    dist.barrier()
    with block_peak() as block:  # the worker's own phases reset the allocator's peak counters
        seconds, (oom, grad_norm) = harness.timed(update, torch.cuda.synchronize if cuda else None)
    peak = block["gib"]
    seconds, peak, resident, oom = reduce_max([seconds, peak, resident, oom])
    if oom:
        return None
    return {"s": seconds, "peak_GiB": peak, "resident_GiB": resident, "grad_norm": grad_norm}


def summarize(runs: list[dict[str, float]], tokens_per_gpu: int) -> dict[str, Any]:
    """Median, quartiles and range (harness.spread) of the timed updates and the throughput they give."""
    secs = [r["s"] for r in runs]
    sp = harness.spread(secs)
    med = sp["median"]
    return {"oom": False, "s_median": med, "s_q1": sp["q1"], "s_q3": sp["q3"], "s_min": sp["min"],
            "s_max": sp["max"], "all_s": secs,
            "tokens_per_s_per_gpu": tokens_per_gpu / med, "tokens_per_s_per_gpu_min": tokens_per_gpu / max(secs),
            "tokens_per_s_per_gpu_max": tokens_per_gpu / min(secs),
            "peak_GiB": max(r["peak_GiB"] for r in runs), "resident_GiB": runs[-1]["resident_GiB"],
            "grad_norm": runs[-1]["grad_norm"]}


def drop(workers: dict[int, Any], sp: int) -> None:
    """Forget a worker whose update ran out of memory (its FSDP state may be half-way) and free its memory."""
    del workers[sp]
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def measure_length(workers: dict[int, Any], length: int, vocab: int, rank: int, args: argparse.Namespace
                   ) -> dict[str, Any]:
    """Warm-up, then `args.reps` alternating timed updates of every live worker at response length `length`."""
    batch = update_batch(args.rows, args.prompt_len, length, vocab, seed=1000 * length + rank)
    runs: dict[int, list[dict[str, float]]] = {sp: [] for sp in workers}
    out: dict[str, Any] = {}
    for rep in range(args.reps + 1):  # rep 0 is the warm-up
        for sp in list(workers):
            park(workers[sp], args.device)
            res = timed_update(workers[sp], batch, args.device)
            if res is None:
                out[str(sp)] = {"oom": True}
                runs.pop(sp)
                drop(workers, sp)
                continue
            park(workers[sp], "cpu")
            if rep:
                runs[sp].append(res)
    tokens_per_gpu = args.rows * (args.prompt_len + length)  # WORLD ranks x rows each, over WORLD devices
    out.update({str(sp): summarize(r, tokens_per_gpu) for sp, r in runs.items()})
    return out


def build_workers(model_dir: Path, args: argparse.Namespace) -> dict[int, Any]:
    """An initialised actor worker per SP size, each parked on the CPU."""
    from rlpost.workers.fsdp_workers import ActorRolloutRefWorker

    workers = {}
    for sp in SIZES:
        w = ActorRolloutRefWorker(worker_config(model_dir, sp, args), role="actor")
        w.init_model()
        park(w, "cpu")
        workers[sp] = w
    return workers


def build_model_dir(out: Path, tiny: bool) -> Path:
    if tiny:
        from rlpost.utils.tiny_model import build_tiny_model

        return build_tiny_model(out)  # 2 query heads, 1 KV head: SP=2 repeats it
    path = bench_limits.build_model(out)
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return path


def start_rank(rank: int, world: int, port: int, device: str, tiny: bool, tmp: str) -> tuple[Path, int]:
    """Join the process group of `world` spawned ranks; rank 0 builds the model. Returns (model dir, vocab)."""
    import torch.distributed as dist

    from rlpost.utils.distributed import init_distributed

    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RLPOST_DEVICE": device})
    if device == "cpu":
        torch.set_num_threads(1)
    init_distributed(device)
    model_dir = Path(tmp) / "model"
    if rank == 0:
        build_model_dir(model_dir, tiny)
    dist.barrier()
    return model_dir, json.loads((model_dir / "config.json").read_text())["vocab_size"]


def run_rank(rank: int, port: int, args: argparse.Namespace, tmp: str) -> None:
    """One of the WORLD processes: model (built by rank 0), both workers, every length; rank 0 writes JSON."""
    import torch.distributed as dist

    model_dir, vocab = start_rank(rank, WORLD, port, args.device, args.tiny, tmp)
    workers = build_workers(model_dir, args)
    results: dict[str, Any] = {}
    for length in sorted(args.lengths):
        results[str(length)] = {str(sp): {"oom": True, "skipped": "out of memory at a shorter length"}
                                for sp in SIZES if sp not in workers}
        results[str(length)].update(measure_length(workers, length, vocab, rank, args))
        if rank == 0:
            print(f"[ulysses] L={length}: {json.dumps(results[str(length)], default=str)}", flush=True)
    if rank == 0:
        write_results(results, model_dir, args)
    dist.destroy_process_group()


def build_result(results: dict[str, Any], model: dict[str, Any], args: argparse.Namespace,
                 env: dict[str, Any] | None = None) -> harness.Result:
    """The harness result of `results` (length -> setting -> summary or {"oom": true}) on the model of `model`
    (its config.json): one timing metric per length and measured setting."""
    for entry in results.values():
        one, two = entry.get("1", {}), entry.get("2", {})
        if not one.get("oom", True) and not two.get("oom", True):
            entry["sp2_over_sp1_tokens_per_s"] = two["tokens_per_s_per_gpu"] / one["tokens_per_s_per_gpu"]
    arch = "tiny (random weights)" if args.tiny else "Qwen2.5-0.5B (random weights)"
    res = harness.Result("ulysses", harness.command_line(), args.reps, env=env or harness.environment())
    for length, entry in results.items():
        for sp in map(str, SIZES):
            r = entry.get(sp, {"oom": True})
            if not r["oom"]:
                res.timing(f"L{length}_sp{sp}_update_s", r["all_s"], tokens_per_s_per_gpu=r["tokens_per_s_per_gpu"],
                           peak_GiB=r["peak_GiB"])
    res.extra.update(world=WORLD, settings=harness.params(args), model={"arch": arch, **{
        k: model.get(k) for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                                  "vocab_size")}}, results=results)
    return res


def write_results(results: dict[str, Any], model_dir: Path, args: argparse.Namespace) -> None:
    res = build_result(results, json.loads((model_dir / "config.json").read_text()), args)
    print(table(results))
    print(f"[ulysses] wrote {res.write(path=args.json_out)}", flush=True)


def table(results: dict[str, Any]) -> str:
    lines = [f"{'L':>7} {'SP':>3} {'tok/s/GPU (min-max)':>28} {'peak GiB':>9} {'s median':>9} {'SP2/SP1':>8}"]
    for length, entry in results.items():
        ratio = entry.get("sp2_over_sp1_tokens_per_s")
        for sp in map(str, SIZES):
            r = entry[sp]
            if r["oom"]:
                lines.append(f"{length:>7} {sp:>3} {'OOM':>28}")
                continue
            tps = f"{r['tokens_per_s_per_gpu']:.0f} ({r['tokens_per_s_per_gpu_min']:.0f}-" \
                  f"{r['tokens_per_s_per_gpu_max']:.0f})"
            col = f"{ratio:.3f}" if sp == "2" and ratio is not None else ""
            lines.append(f"{length:>7} {sp:>3} {tps:>28} {r['peak_GiB']:>9.2f} {r['s_median']:>9.3f} {col:>8}")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[4096, 16384, 32768, 65536],
                    help="response lengths L (tokens)")
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--rows", type=int, default=1, help="rows per rank per update (micro-batch 1)")
    ap.add_argument("--sp-micro", type=int, default=2, help="SP=2's micro-batch rows (SP=1's is 1)")
    ap.add_argument("--reps", type=int, default=5, help="timed updates per (L, SP) after one warm-up")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--tiny", action="store_true", help="rlpost's tiny test model instead of the 0.5B one")
    ap.add_argument("--override", nargs="*", default=[], help="extra Hydra overrides of ppo_trainer")
    ap.add_argument("--json-out", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.device == "cuda" and torch.cuda.device_count() < WORLD:
        ap.error(f"--device cuda needs {WORLD} GPUs, found {torch.cuda.device_count()}")
    return args


def main(argv: list[str] | None = None) -> None:
    import torch.multiprocessing as mp

    from rlpost.utils.distributed import free_port

    args = parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(run_rank, args=(free_port(), args, tmp), nprocs=WORLD, join=True)


if __name__ == "__main__":
    main()
