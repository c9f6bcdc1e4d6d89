"""Where rlpost's old_log_prob and update lose to the strong bare loops on the GSM8K-shaped workload, per setting.

    python -m benchmarks.bench_phase_gap --model-dir /tmp/m_0.5b --reps 3 --variants default no_ckpt   # GPU
    python -m benchmarks.bench_phase_gap --toy --reps 1 --variants default                           # CPU smoke

Goals A1 / A2 (issue 48) are measured by `bench_realistic.py` inside full GRPO steps; this bench is the
microscope beside it. The rows are the workload's (`benchmarks.workload`: long-tailed prompt lengths and response
caps, random token ids, no vLLM), laid out as the rollout returns them (prompts left-padded, responses
right-padded). Each variant runs in its own process: rlpost's actor worker with `bench_realistic`'s settings
(packed rows, dynamic micro-batches, the fused head, Liger where installed) plus the variant's overrides, and the
strong bare loops (`benchmarks.strong_limits`) with the same gradient checkpointing and token budgets. After one
untimed pass of each, `--reps` rounds alternate the two sides (rlpost old_log_prob and update_actor, bare forward
and train); then one torch.profiler pass of each of the four splits its wall time into device-busy time and idle
time, with the top kernels (`bench_actor_gap.profiled`). So a gap reads as extra device work (busy minus bare
busy) or as a device waiting for the host (wall minus busy).

Writes one `benchmarks.harness` result, `benchmarks/results/<date>_<gpu|cpu>/phase_gap.json` (or `--out`): per
variant the medians, the paired ratios bare / rlpost with 95 % intervals, both sides' MFU (6·N·tokens and
2·N·tokens over 989 TFLOP/s) and the four profiles.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.append(str(REPO / "benchmarks"))

PEAK = 989e12
ARR = "actor_rollout_ref"
# variant name -> (ppo_trainer overrides, whether the bare loops checkpoint, token-budget multiplier)
_NO_CKPT = f"{ARR}.model.enable_gradient_checkpointing=false"
_COMPILE = f"{ARR}.actor.use_torch_compile=true"
_ONE_UNIT = f"{ARR}.actor.fsdp_config.wrap_policy.min_num_params=1000000000000"  # the whole model one FSDP unit
_NO_RESHARD = f"{ARR}.actor.fsdp_config.reshard_after_forward=false"
_NO_SYNC = f"{ARR}.actor.fsdp_config.use_no_sync_for_gradient_accumulation=true"
VARIANTS: dict[str, tuple[list[str], bool, int]] = {
    "default": ([], True, 1),
    "no_ckpt": ([_NO_CKPT], False, 1),
    "no_ckpt_2x": ([_NO_CKPT], False, 2),
    "no_ckpt_4x": ([_NO_CKPT], False, 4),
    "bf16_master": ([f"{ARR}.actor.fsdp_config.model_dtype=bf16"], True, 1),
    "no_reshard": ([_NO_RESHARD], True, 1),
    "no_sync": ([_NO_SYNC], True, 1),
    "one_unit": ([_ONE_UNIT], True, 1),
    "compile": ([_COMPILE], True, 1),
    "no_ckpt_compile": ([_NO_CKPT, _COMPILE], False, 1),
    # everything above that keeps fp32 master weights, bigger micro-batches
    "best": ([_NO_CKPT, _COMPILE, _ONE_UNIT, _NO_RESHARD, _NO_SYNC], False, 2),
}


def batch_rows(args: argparse.Namespace, vocab: int) -> tuple[Any, list[tuple[list[int], list[int]]]]:
    """The rollout-shaped DataProto of the workload's rows and the same (prompt ids, response ids) pairs."""
    import torch

    from benchmarks import workload
    from rlpost import keys
    from rlpost.protocol import DataProto

    wl = workload.gsm8k_shaped(args.prompts, args.n, args.cap, args.seed)
    prompts = workload.token_prompts(wl, vocab, args.seed)
    g = torch.Generator().manual_seed(args.seed)
    rows = wl.rows()
    b, p, r = len(rows), args.prompt_len, args.cap
    ids = torch.zeros(b, p + r, dtype=torch.long)
    attn = torch.zeros(b, p + r, dtype=torch.long)
    seqs = []
    for i, (plen, rlen) in enumerate(rows):
        prompt = prompts[i // args.n]
        assert len(prompt) == plen <= p, (len(prompt), plen, p)
        response = torch.randint(10, vocab, (rlen,), generator=g)
        ids[i, p - plen:p] = torch.tensor(prompt)
        ids[i, p:p + rlen] = response
        attn[i, p - plen:p + rlen] = 1
        seqs.append((list(prompt), response.tolist()))
    r_mask = attn[:, p:].clone()
    batch = DataProto.from_dict(tensors={
        keys.INPUT_IDS: ids, keys.ATTENTION_MASK: attn, keys.POSITION_IDS: (attn.cumsum(-1) - 1).clamp(min=0),
        keys.RESPONSES: ids[:, p:].clone(), keys.RESPONSE_MASK: r_mask,
        keys.OLD_LOG_PROBS: torch.full((b, r), -12.0), keys.REF_LOG_PROB: torch.full((b, r), -12.0),
        keys.ADVANTAGES: torch.randn(b, r, generator=g) * r_mask}, meta_info={keys.META_TEMPERATURE: 1.0})
    return batch, seqs


def actor_worker(model_dir: Path, args: argparse.Namespace, overrides: list[str], device: str) -> Any:
    """An actor-only worker in this process with bench_realistic's settings and `overrides`."""
    from bench_kernels import actor_worker_from

    over = [f"{ARR}.model.path={model_dir}", f"{ARR}.model.use_remove_padding=true",
            f"{ARR}.model.enable_gradient_checkpointing=true", f"{ARR}.model.use_fused_kernels=true",
            f"data.max_prompt_length={args.prompt_len}", f"data.max_response_length={args.cap}",
            f"{ARR}.rollout.n={args.n}", f"{ARR}.actor.ppo_mini_batch_size={args.prompts}",
            f"{ARR}.actor.ppo_micro_batch_size_per_gpu=32", f"{ARR}.rollout.log_prob_micro_batch_size_per_gpu=32",
            f"{ARR}.actor.use_dynamic_bsz=true", f"{ARR}.actor.ppo_max_token_len_per_gpu={args.train_tokens}",
            f"{ARR}.rollout.log_prob_use_dynamic_bsz=true",
            f"{ARR}.rollout.log_prob_max_token_len_per_gpu={args.fwd_tokens}",
            f"{ARR}.actor.use_kl_loss=true", f"{ARR}.actor.kl_loss_type=low_var_kl", "trainer.n_gpus_per_node=1",
            *([f"{ARR}.model.use_liger=true"] if args.liger else []), *overrides]
    return actor_worker_from(over, device)


def run_variant(args: argparse.Namespace) -> dict[str, Any]:
    """This process's variant: timings, ratios, MFU and profiles (printed as one JSON line)."""
    import torch
    from bench_actor_gap import profiled

    from benchmarks import harness
    from benchmarks.strong_limits import StrongLimits

    overrides, ckpt, mult = VARIANTS[args.variant]
    args.fwd_tokens *= mult
    args.train_tokens *= mult
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    worker = actor_worker(args.model_dir, args, overrides + list(args.override), device)
    vocab = worker.actor_module.config.vocab_size
    batch, seqs = batch_rows(args, vocab)
    lim = StrongLimits(args.model_dir, seqs, args.fwd_tokens, args.train_tokens, ckpt, device,
                       liger=bool(args.liger))
    sync = torch.cuda.synchronize if cuda else None
    phases = {"rlpost_old_log_prob": lambda: worker.compute_log_prob(batch),
              "rlpost_update": lambda: worker.update_actor(batch),
              "bare_forward": lambda: lim.fwd(), "bare_train": lambda: lim.train()}
    for fn in phases.values():  # untimed: compilation, allocator, optimiser state
        fn()
    times: dict[str, list[float]] = {k: [] for k in phases}

    def side(names: tuple[str, ...]) -> Any:
        def go() -> dict[str, float]:
            out = {}
            for name in names:
                out[name] = harness.timed(phases[name], sync)[0]
                times[name].append(out[name])
            return {**out, "s": sum(out.values())}
        return go

    harness.alternate({"rlpost": side(("rlpost_old_log_prob", "rlpost_update")),
                       "bare": side(("bare_forward", "bare_train"))}, args.reps, probe=False)
    tokens, params = lim.tokens, lim.params
    out: dict[str, Any] = {"variant": args.variant, "overrides": overrides + list(args.override),
                           "bare_grad_ckpt": ckpt, "fwd_tokens": args.fwd_tokens, "train_tokens": args.train_tokens,
                           "tokens": tokens, "params": params, "applied": lim.applied, "times": times}
    for name, num, den in (("old_log_prob", "bare_forward", "rlpost_old_log_prob"),
                           ("update", "bare_train", "rlpost_update")):
        out[f"{name}_bare_over_rlpost"] = harness.paired_ratio(times[num], times[den]) if args.reps > 1 else \
            {"value": times[num][0] / times[den][0]}
    for name, k in (("rlpost_old_log_prob", 2), ("bare_forward", 2), ("rlpost_update", 6), ("bare_train", 6)):
        out[f"{name}_mfu"] = k * params * tokens / harness.spread(times[name])["median"] / PEAK
    if args.profile and (args.profile_variants is None or args.variant in args.profile_variants):
        out["profiles"] = {name: profiled(fn, cuda) for name, fn in phases.items()}
    if cuda:
        out["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    return out


def pick(result: dict[str, Any]) -> str:
    """`ACTOR_OVERRIDES=...` and `CRITIC_OVERRIDES=...` shell lines (plus the token budgets) of the variant whose
    rlpost old_log_prob + update medians sum least; the critic form maps the actor's model/FSDP keys onto
    `critic.*` (the compile key has no critic use: the value head has no vocabulary)."""
    from benchmarks import harness

    rows = {k: v for k, v in result["variants"].items() if "times" in v}
    if not rows:
        raise SystemExit("bench_phase_gap --pick: no variant finished in that file")

    def cost(row: dict[str, Any]) -> float:
        return sum(harness.spread(row["times"][k])["median"] for k in ("rlpost_old_log_prob", "rlpost_update"))

    name = min(rows, key=lambda k: cost(rows[k]))
    row = rows[name]
    critic = []
    for o in row["overrides"]:
        if o.startswith(f"{ARR}.model.enable_gradient_checkpointing"):
            critic.append(o.replace(f"{ARR}.model.", "critic.model."))
        elif o.startswith(f"{ARR}.actor.fsdp_config."):
            critic.append(o.replace(f"{ARR}.actor.fsdp_config.", "critic.model.fsdp_config."))
    return "\n".join([f"VARIANT={name}", f"ACTOR_OVERRIDES='{' '.join(row['overrides'])}'",
                      f"CRITIC_OVERRIDES='{' '.join(critic)}'", f"GRAD_CKPT={int(row['bare_grad_ckpt'])}",
                      f"FWD_TOKENS={row['fwd_tokens']}", f"TRAIN_TOKENS={row['train_tokens']}"])


def main(argv: list[str] | None = None) -> Any:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-dir", type=Path, default=None, help="built when missing (the 0.5B architecture)")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--cap", type=int, default=1024)
    ap.add_argument("--prompt-len", type=int, default=192)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--fwd-tokens", type=int, default=32768)
    ap.add_argument("--train-tokens", type=int, default=16384)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--liger", type=int, default=None, help="default: 1 on a GPU")
    ap.add_argument("--profile", type=int, default=1)
    ap.add_argument("--profile-variants", nargs="*", default=None,
                    help="profile only these variants (default: every variant when --profile 1)")
    ap.add_argument("--pick", type=Path, default=None,
                    help="print the overrides (actor form, then critic form) of the variant of this phase_gap.json "
                         "whose rlpost old_log_prob + update took least, and exit")
    ap.add_argument("--variants", nargs="+", default=["default"], choices=list(VARIANTS))
    ap.add_argument("--override", nargs="*", default=[], help="more ppo_trainer overrides for every variant")
    ap.add_argument("--toy", action="store_true", help="CPU smoke: a tiny model, 2 x 2 rows, cap 64")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--variant", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--vocab", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.pick is not None:
        print(pick(json.loads(args.pick.read_text())))
        return None
    if args.toy:
        args.prompts, args.n, args.cap, args.fwd_tokens, args.train_tokens = 2, 2, 64, 1024, 512
    if args.variant is not None:  # one variant, in its own process
        import torch

        if args.liger is None:  # as the strong loops decide: on a GPU, when liger-kernel is installed
            import importlib.util

            args.liger = int(torch.cuda.is_available() and importlib.util.find_spec("liger_kernel") is not None)
        print("PHASE_GAP " + json.dumps(run_variant(args)), flush=True)
        return None
    import bench_limits

    from benchmarks import harness

    if args.model_dir is None or not args.model_dir.exists():
        target = args.model_dir or Path("/tmp/phase_gap_model")
        if args.toy:
            from rlpost.utils.tiny_model import build_tiny_model

            args.model_dir = Path(build_tiny_model(target))
        else:
            args.model_dir = bench_limits.build_model(target)
    res = harness.Result("phase_gap", harness.command_line(), args.reps)
    res.extra["variants"] = {}
    for variant in args.variants:
        cmd = [sys.executable, "-m", "benchmarks.bench_phase_gap", "--variant", variant, *sys.argv[1:]]
        if "--model-dir" not in sys.argv:
            cmd += ["--model-dir", str(args.model_dir)]
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
        line = next((x for x in proc.stdout.splitlines() if x.startswith("PHASE_GAP ")), None)
        if proc.returncode != 0 or line is None:
            print(proc.stdout[-3000:], proc.stderr[-6000:], sep="\n", flush=True)
            res.extra["variants"][variant] = {"error": f"rc {proc.returncode}", "stderr": proc.stderr[-2000:]}
            continue
        row = json.loads(line[len("PHASE_GAP "):])
        res.extra["variants"][variant] = row
        for name in ("old_log_prob", "update"):
            stats = row[f"{name}_bare_over_rlpost"]
            res.metric(f"{variant}_{name}_bare_over_rlpost", stats["value"], stats.get("ci_low"),
                       stats.get("ci_high"), unit="bare/rlpost")
        for name in ("rlpost_old_log_prob", "bare_forward", "rlpost_update", "bare_train"):
            res.metric(f"{variant}_{name}_mfu", row[f"{name}_mfu"], unit="fraction")
            res.timing(f"{variant}_{name}_s", row["times"][name])
        busy = {k: (v["wall_s"], v["device_busy_s"]) for k, v in row.get("profiles", {}).items()}
        print(f"[phase_gap] {variant}: olp {row['old_log_prob_bare_over_rlpost']['value']:.3f} "
              f"update {row['update_bare_over_rlpost']['value']:.3f} | MFU rlpost olp "
              f"{row['rlpost_old_log_prob_mfu']:.3f} upd {row['rlpost_update_mfu']:.3f}, bare fwd "
              f"{row['bare_forward_mfu']:.3f} train {row['bare_train_mfu']:.3f} | wall/busy {busy}", flush=True)
        path = res.write(path=args.out) if args.out else res.write()
        print(f"[phase_gap] wrote {path}", flush=True)
    return res


if __name__ == "__main__":
    main()
