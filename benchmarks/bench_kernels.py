"""Remove-padding and the fused log-prob on one GPU: old_log_prob and update_actor times and peak memory.

    python benchmarks/bench_kernels.py                      # GPU host: 64 prompts x 8, 512 + 512, micro 32
    python benchmarks/bench_kernels.py --toy --reps 2       # CPU smoke test (tiny model, 8 rows, 16 + 16)

One `ActorRolloutRefWorker(role="actor")` (no rollout engine needed) built from the package's `ppo_trainer`
config with `use_remove_padding=true` (its attention: `rlpost.engine.packed_attention`; padded batches still
get SDPA with a padding mask). Each variant sets the actor's `use_remove_padding` / `use_fused_kernels` and
runs `compute_log_prob` (with entropy, as old_log_prob does) and `update_actor` (one optimiser step per
mini-batch, KL loss on) on the same rows; the variants alternate, `--reps` rounds after one warm-up round,
medians reported. Two batches: every response of `--response-len` tokens ("fixed") and response lengths drawn
uniformly in [--min-response, --response-len] ("uniform"). `--prompt-real N` left-pads every prompt to
`--prompt-len` around N real tokens, as a dataset of short prompts gives (GSM8K-like: ~28-token prompts padded to
512 in `main_ppo`). The update starts from the same weights each
round only in distribution (each round trains), which is what a run sees.
Writes one `benchmarks.harness` result, `benchmarks/results/<date>_<gpu|cpu>/kernels_<batches>[_prompt<N>][_toy].json`
(`--out-dir` for another folder; run `--batches fixed` and `--batches uniform` apart to stay under a 10-minute
command): a `<batch>_<variant>_<phase>_s` timing metric each (median, spread, every round), the per-batch
summaries under the batch names.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.append(str(REPO))  # after PYTHONPATH: a snapshot of rlpost put there wins
sys.path.append(str(REPO / "benchmarks"))

import bench_limits  # noqa: E402

from benchmarks import harness  # noqa: E402
from rlpost import keys  # noqa: E402
from rlpost.protocol import DataProto  # noqa: E402
from rlpost.utils.distributed import free_port  # noqa: E402
from rlpost.utils.profiler import block_peak  # noqa: E402

VARIANTS = {"padded": (False, False), "packed": (True, False), "padded_fused": (False, True),
            "packed_fused": (True, True)}  # name -> (use_remove_padding, use_fused_kernels)


def actor_worker(model_dir: Path, args: argparse.Namespace, device: str) -> Any:
    """An actor-only `ActorRolloutRefWorker` in this process (rank 0 of 1), model and optimiser built."""


    arr = "actor_rollout_ref"
    over = [f"{arr}.model.path={model_dir}", f"{arr}.model.use_remove_padding=true",
            f"{arr}.model.enable_gradient_checkpointing=true", f"data.max_prompt_length={args.prompt_len}",
            f"data.max_response_length={args.response_len}", f"{arr}.rollout.n={args.n}",
            f"{arr}.rollout.log_prob_micro_batch_size_per_gpu={args.micro}",
            f"{arr}.actor.ppo_mini_batch_size={args.prompts}", f"{arr}.actor.ppo_micro_batch_size_per_gpu={args.micro}",
            f"{arr}.actor.use_kl_loss=true", "trainer.n_gpus_per_node=1", *args.override]
    return actor_worker_from(over, device)


def actor_worker_from(overrides: list[str], device: str) -> Any:
    """An actor-only `ActorRolloutRefWorker` (rank 0 of 1) of the package's `ppo_trainer` with `overrides`."""
    from hydra import compose, initialize_config_module

    from rlpost.workers.fsdp_workers import ActorRolloutRefWorker

    with initialize_config_module(config_module="rlpost.trainer.config", version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=overrides)
    for key, val in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                     "MASTER_PORT": str(free_port()), "RLPOST_DEVICE": device}.items():
        os.environ.setdefault(key, val)
    worker = ActorRolloutRefWorker(cfg.actor_rollout_ref, role="actor")
    worker.init_model(total_training_steps=1000)
    return worker


def rows(args: argparse.Namespace, vocab: int, uniform: bool) -> DataProto:
    """prompts x n rows: prompts of `prompt_len` (left-padded around `prompt_real` real tokens when set),
    right-padded responses (all `response_len`, or uniform lengths), with old/ref log-probs and GRPO-like
    advantages."""
    g = torch.Generator().manual_seed(0)
    b, p, r = args.prompts * args.n, args.prompt_len, args.response_len
    lens = torch.randint(args.min_response, r + 1, (b,), generator=g) if uniform else torch.full((b,), r)
    r_mask = (torch.arange(r)[None] < lens[:, None]).long()
    ids = torch.randint(10, vocab, (b, p + r), generator=g)
    ids[:, p:] *= r_mask
    real = args.prompt_real or p
    p_mask = (torch.arange(p)[None] >= p - real).long().expand(b, p)
    ids[:, :p] *= p_mask
    attn = torch.cat([p_mask, r_mask], dim=1)
    return DataProto.from_dict(tensors={
        keys.INPUT_IDS: ids, keys.ATTENTION_MASK: attn, keys.POSITION_IDS: (attn.cumsum(-1) - 1).clamp(min=0),
        keys.RESPONSES: ids[:, p:], keys.RESPONSE_MASK: r_mask,
        keys.OLD_LOG_PROBS: torch.full((b, r), -12.0), keys.REF_LOG_PROB: torch.full((b, r), -12.0),
        keys.ADVANTAGES: torch.randn(b, r, generator=g)}, meta_info={keys.META_TEMPERATURE: 1.0})


def timed_phase(fn: Any, cuda: bool) -> tuple[float, float]:
    """(seconds, peak GiB allocated during the call; 0 on CPU)."""
    if cuda:
        torch.cuda.synchronize()
    with block_peak() as peak:  # the worker's own phases reset the allocator's peak counters
        seconds, _ = harness.timed(fn, torch.cuda.synchronize if cuda else None)
    return seconds, peak["gib"]


def one_round(worker: Any, batch: DataProto, variants: list[str], cuda: bool) -> dict[str, dict[str, float]]:
    """Each variant once: old_log_prob (log-probs + entropy) then update_actor on the same rows."""
    out = {}
    for name in variants:
        worker.actor.use_remove_padding, worker.actor.use_fused_kernels = VARIANTS[name]
        logp_s, logp_gb = timed_phase(lambda: worker.compute_log_prob(batch), cuda)
        upd_s, upd_gb = timed_phase(lambda: worker.update_actor(batch), cuda)
        out[name] = {"old_log_prob_s": logp_s, "old_log_prob_peak_gb": logp_gb, "update_s": upd_s,
                     "update_peak_gb": upd_gb}
    return out


def measure(worker: Any, batch: DataProto, args: argparse.Namespace, cuda: bool) -> dict[str, Any]:
    """Warm-up round, then `reps` alternating rounds: per variant the medians and every repetition."""
    one_round(worker, batch, args.variants, cuda)
    reps = [one_round(worker, batch, args.variants, cuda) for _ in range(args.reps)]
    res: dict[str, Any] = {}
    for name in args.variants:
        per = {k: [r[name][k] for r in reps] for k in reps[0][name]}
        res[name] = {**{f"median_{k}": statistics.median(v) for k, v in per.items()}, "reps": per}
    base = res.get("padded")
    for name in args.variants:
        if base is not None and name != "padded":
            res[name]["speedup_vs_padded"] = {
                k: base[f"median_{k}"] / res[name][f"median_{k}"] for k in ("old_log_prob_s", "update_s")}
    real = batch.batch[keys.ATTENTION_MASK].sum().item()
    res["tokens"] = {"real": int(real), "padded": int(batch.batch[keys.ATTENTION_MASK].numel())}
    return res


def build_result(args: argparse.Namespace, res: dict[str, Any], env: dict[str, Any] | None = None
                 ) -> harness.Result:
    """The harness result of each batch's `measure` output: one timing metric per batch, variant and phase."""
    name = f"kernels_{'_'.join(args.batches)}{f'_prompt{args.prompt_real}' if args.prompt_real else ''}"
    out = harness.Result(name + ("_toy" if args.toy else ""), harness.command_line(), args.reps,
                         env=env or harness.environment())
    for kind in args.batches:
        for variant in args.variants:
            for phase in ("old_log_prob_s", "update_s"):
                out.timing(f"{kind}_{variant}_{phase}", res[kind][variant]["reps"][phase])
    out.extra.update(args=harness.params(args), **res)
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--prompt-real", type=int, default=None,
                    help="real tokens per prompt, left-padded to --prompt-len (default: all real)")
    ap.add_argument("--response-len", type=int, default=512, help="fixed length; the uniform maximum is 2x")
    ap.add_argument("--min-response", type=int, default=64)
    ap.add_argument("--micro", type=int, default=32)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--batches", nargs="+", default=["fixed", "uniform"], choices=["fixed", "uniform"])
    ap.add_argument("--model-dir", type=Path, default=None, help="default: a random Qwen2.5-0.5B architecture")
    ap.add_argument("--toy", action="store_true", help="CPU smoke test: tiny model, 2 x 4 rows, 16 + 16 tokens")
    ap.add_argument("--override", nargs="*", default=[], help="extra ppo_trainer overrides")
    ap.add_argument("--out-dir", type=Path, default=None,
                    help="folder of the result (default benchmarks/results/<date>_<gpu|cpu>)")
    args = ap.parse_args(argv)
    if args.toy:
        args.prompts, args.n, args.prompt_len, args.response_len, args.min_response, args.micro = 2, 4, 16, 16, 4, 4
    if args.prompt_real is not None and not 1 <= args.prompt_real <= args.prompt_len:
        ap.error(f"--prompt-real {args.prompt_real}: give 1..{args.prompt_len} (--prompt-len) real tokens per prompt")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    cuda = torch.cuda.is_available() and not args.toy
    with tempfile.TemporaryDirectory() as tmp:
        if args.model_dir is not None:
            model_dir = args.model_dir
        elif args.toy:
            from rlpost.utils.tiny_model import build_tiny_model

            model_dir = build_tiny_model(Path(tmp) / "tiny")
        else:
            model_dir = bench_limits.build_model(Path(tmp) / "qwen05_random")
        worker = actor_worker(Path(model_dir), args, "cuda" if cuda else "cpu")
        vocab = worker.actor_module.config.vocab_size
        res: dict[str, Any] = {}
        for kind in args.batches:
            if kind == "uniform":  # lengths in [min, 2 * response_len]: 64..1024 at the default 512
                args.response_len, fixed_len = 2 * args.response_len, args.response_len
            batch = rows(args, vocab, uniform=kind == "uniform")
            res[kind] = measure(worker, batch, args, cuda)
            if kind == "uniform":
                args.response_len = fixed_len
            for name in args.variants:
                print(kind, name, {k: round(v, 4) for k, v in res[kind][name].items() if k.startswith("median")},
                      flush=True)
    print(f"wrote {build_result(args, res).write(session=args.out_dir)}")


if __name__ == "__main__":
    main()
