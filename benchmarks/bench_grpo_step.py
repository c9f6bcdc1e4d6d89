"""One GRPO step through rlpost's own FSDP2 worker and vLLM engine, against the bare limits of the same GPU.

    python benchmarks/bench_grpo_step.py --prompts 64 128 --n 8       # on a GPU host (docs/benchmarks/grpo_step.md)

First runs `benchmarks/bench_limits.py` in a subprocess (fresh CUDA context, same GPU, same model and batch),
then builds `ActorRolloutRefWorker(role="actor_rollout_ref")` from the package's `ppo_trainer` config
(GRPO, KL loss against the reference, ignore_eos, CUDA graphs) and runs the phases of
`RayPPOTrainer.train_step` on it, each timed under the trainer's name: gen, reward (synthetic),
old_log_prob, ref, adv, update_actor (which includes update_weights, reported apart). The worker is
called directly, without Ray: on one GPU the trainer's Ray hop only moves the batch between processes.
Writes one `benchmarks.harness` result, `benchmarks/results/<date>_<gpu|cpu>/grpo_step.json` (`--out-dir` for
another folder, `--json-out` for a file), after every batch size: a `<prompts>x<n>_<phase>_s` timing metric per
batch and phase (median, spread, every measured step), the limit / rlpost ratios as `<prompts>x<n>_ratio_<phase>`
metrics with their targets, the per-batch entries under `per_batch`. `--sweep` writes `micro_sweep.json` the same
way, one `sweep_<spec>_<phase>_s` metric per setting and phase.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.append(str(REPO))  # after PYTHONPATH: a snapshot of rlpost put there wins
sys.path.append(str(REPO / "benchmarks"))

import bench_limits  # noqa: E402

from benchmarks import harness  # noqa: E402
from rlpost import keys  # noqa: E402
from rlpost.protocol import DataProto  # noqa: E402
from rlpost.utils.distributed import free_port  # noqa: E402
from rlpost.utils.profiler import lifetime_peaks  # noqa: E402

# Targets of issue 9: limit time / rlpost time (>=) per phase, and step time / sum of limits (<=).
TARGETS = {"gen": 0.90, "old_log_prob": 0.60, "ref": 0.60, "update_actor": 0.85, "update_weights": 0.90,
           "step_over_sum_limits_max": 1.5}


def grpo_config(model_dir: Path, args: argparse.Namespace, world: int = 1):
    """The package's composed `ppo_trainer` config with the benchmark's overrides."""
    from hydra import compose, initialize_config_module

    over = [
        f"actor_rollout_ref.model.path={model_dir}", "actor_rollout_ref.model.enable_gradient_checkpointing="
        f"{bool(args.grad_ckpt)}", f"data.max_prompt_length={args.prompt_len}",
        f"data.max_response_length={args.response_len}", "algorithm.adv_estimator=grpo",
        f"actor_rollout_ref.rollout.n={args.n}", "actor_rollout_ref.rollout.ignore_eos=true",
        f"actor_rollout_ref.rollout.enforce_eager={args.enforce_eager}",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        f"actor_rollout_ref.rollout.gpu_memory_utilization={args.gpu_memory_utilization}",
        # vLLM's own default for offline use on a GPU of >= 70 GiB (the bare engine's); rlpost's is 8192
        f"actor_rollout_ref.rollout.max_num_batched_tokens={args.max_num_batched_tokens}",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={args.fwd_micro}",
        f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={args.fwd_micro}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={args.mini_prompts}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={args.train_micro}",
        "actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
        f"trainer.n_gpus_per_node={world}", *args.override,
    ]
    with initialize_config_module(config_module="rlpost.trainer.config", version_base=None):
        return compose(config_name="ppo_trainer", overrides=over)


def start_worker(cfg: Any, device: str):
    """An `ActorRolloutRefWorker` in this process (rank 0 of 1), models and engine built."""
    from rlpost.workers.fsdp_workers import ActorRolloutRefWorker

    port = free_port()
    for key, val in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                     "MASTER_PORT": str(port), "RLPOST_DEVICE": device}.items():
        os.environ.setdefault(key, val)
    worker = ActorRolloutRefWorker(cfg.actor_rollout_ref, role="actor_rollout_ref")
    worker.init_model()
    return worker


@contextmanager
def timer(name: str, timing: dict[str, float]) -> Iterator[None]:
    """Wall time of the block, device work included (synchronises before reading the clock)."""
    start = time.perf_counter()
    yield
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    timing[name] = timing.get(name, 0.0) + time.perf_counter() - start


def prompt_batch(prompts: torch.Tensor, n: int) -> DataProto:
    """Left-padded (here: unpadded, fixed-length) prompts with a uid, repeated n times like the trainer."""
    b, p = prompts.shape
    batch = DataProto.from_dict(
        tensors={keys.INPUT_IDS: prompts, keys.ATTENTION_MASK: torch.ones(b, p, dtype=torch.long),
                 keys.POSITION_IDS: torch.arange(p).expand(b, p).clone()},
        non_tensors={keys.UID: np.array([str(uuid.uuid4()) for _ in range(b)], dtype=object)})
    return batch.repeat(n, interleave=True)


def grpo_step(worker: Any, prompts: torch.Tensor | DataProto, n: int) -> dict[str, float]:
    """One GRPO step (phases and names of `RayPPOTrainer.train_step`); returns seconds per phase. `prompts`:
    fixed-length prompt ids (repeated n times here), or a generation batch already repeated."""
    from rlpost.trainer.ppo.core_algos import compute_advantage

    timing: dict[str, float] = {}
    with timer("step", timing):
        gen_in = prompts if isinstance(prompts, DataProto) else prompt_batch(prompts, n)
        gen_in.meta_info.update({keys.META_DO_SAMPLE: True, keys.META_VALIDATE: False})
        with timer("gen", timing):
            batch = worker.generate_sequences(gen_in)
        gen_metrics = batch.meta_info.get(keys.META_METRICS, {})
        for part in ("gen_wake", "gen_engine", "gen_sleep"):  # the worker's own split of gen
            if f"timing_s/{part}" in gen_metrics:
                timing[part] = float(gen_metrics[f"timing_s/{part}"])
        with timer("reward", timing):  # synthetic score on the last response token
            mask = batch.batch[keys.RESPONSE_MASK]
            scores = torch.zeros(mask.shape)
            scores[:, -1] = (batch.batch[keys.RESPONSES] % 7 == 0).float().mean(-1)
            batch.batch[keys.TOKEN_LEVEL_SCORES] = scores
        with timer("old_log_prob", timing):
            out = worker.compute_log_prob(batch)
            out.batch.pop(keys.ENTROPYS, None)
            batch = batch.union(out)
        with timer("ref", timing):
            batch = batch.union(worker.compute_ref_log_prob(batch))
        with timer("adv", timing):
            batch.batch[keys.TOKEN_LEVEL_REWARDS] = scores
            adv, ret = compute_advantage(scores, mask, "grpo", index=batch.non_tensor_batch[keys.UID])
            batch.batch[keys.ADVANTAGES], batch.batch[keys.RETURNS] = adv, ret
        with timer("update_actor", timing):
            metrics = worker.update_actor(batch).meta_info[keys.META_METRICS]
    timing["update_weights"] = float(metrics["timing_s/update_weights"])
    timing["update_actor_only"] = timing["update_actor"] - timing["update_weights"]
    assert batch.batch[keys.RESPONSES].shape == (len(gen_in), worker.config.rollout.response_length)
    timing["tokens"] = int(batch.batch[keys.ATTENTION_MASK].sum())
    return timing


def ratios(step: dict[str, float], lim: dict[str, Any], reload: dict[str, Any]) -> dict[str, float]:
    """limit time / rlpost time per phase (>= target is good); step / sum of limits (<= 1.5 is good).
    `update_weights` is against vLLM's `reload_weights` (the issue's limit); `update_weights_vs_parts`
    against the engine's plain `load_weights` plus its weights-only wake-up, the two things a sync does."""
    reload_s = reload["s"]
    return {
        "gen": lim["gen"]["s"] / step["gen"],
        "old_log_prob": lim["fwd"]["s"] / step["old_log_prob"],
        "ref": lim["fwd"]["s"] / step["ref"],
        "update_actor": lim["train"]["s"] / step["update_actor_only"],
        "update_weights": reload_s / step["update_weights"],
        "update_weights_vs_parts": (reload.get("load_s", float("nan")) + reload.get("wake_weights_s", float("nan")))
        / step["update_weights"],
        "step_over_sum_limits": step["step"] / lim["sum_limits_s"],
    }


def run_limits(args: argparse.Namespace, model_dir: Path, out: Path) -> dict[str, Any]:
    """bench_limits.py in a subprocess with the same model, batch and micro-batch sizes."""
    cmd = [sys.executable, str(REPO / "benchmarks" / "bench_limits.py"), "--model-dir", str(model_dir),
           "--json-out", str(out), "--n", str(args.n), "--prompt-len", str(args.prompt_len),
           "--response-len", str(args.response_len), "--fwd-micro", str(args.fwd_micro),
           "--train-micro", str(args.train_micro), "--mini-prompts", str(args.mini_prompts),
           "--grad-ckpt", str(args.grad_ckpt), "--gpu-memory-utilization", str(args.gpu_memory_utilization),
           "--gen-reps", str(args.reps), "--prompts", *map(str, args.prompts)]
    subprocess.run(cmd, check=True)
    return json.loads(out.read_text())


SETTING_DEFAULTS = {"tm": 8, "fm": 16, "dyn": 0, "rmpad": 0}


def parse_setting(spec: str) -> dict[str, int]:
    """'tm=16,fm=16,dyn=0,rmpad=1' -> train micro rows, log-prob micro rows, dynamic-bsz token cap, rmpad."""
    out = dict(SETTING_DEFAULTS)
    for part in filter(None, spec.split(",")):
        key, _, val = part.partition("=")
        if key not in out:
            raise ValueError(f"--sweep: unknown key {key!r} in {spec!r} (known: {sorted(out)})")
        out[key] = int(val)
    return out


def apply_setting(worker: Any, s: dict[str, int]) -> None:
    """Change the worker's micro-batching / remove-padding in place (read at every call)."""
    from omegaconf import open_dict

    cfg = worker.config
    with open_dict(cfg):
        cfg.actor.ppo_micro_batch_size_per_gpu = s["tm"]
        cfg.actor.use_dynamic_bsz = s["dyn"] > 0
        cfg.actor.ppo_max_token_len_per_gpu = s["dyn"] or 16384
        for group in (cfg.rollout, cfg.ref):
            group.log_prob_micro_batch_size_per_gpu = s["fm"]
            group.log_prob_use_dynamic_bsz = s["dyn"] > 0
            group.log_prob_max_token_len_per_gpu = s["dyn"] or 16384
    assert worker.actor.config.ppo_micro_batch_size_per_gpu == s["tm"]  # the actor reads the same node
    worker.actor.use_remove_padding = worker.ref_policy.use_remove_padding = bool(s["rmpad"])


def sweep_setting(worker: Any, base: DataProto, s: dict[str, int], warm_update: bool) -> dict[str, float]:
    """old_log_prob (after one untimed call), ref and update_actor on a copy of one generated batch."""
    from rlpost.trainer.ppo.core_algos import compute_advantage

    apply_setting(worker, s)
    timing: dict[str, float] = {}
    batch = base.select()
    worker.compute_log_prob(batch)  # warm-up at this micro-batch shape
    with timer("old_log_prob", timing):
        out = worker.compute_log_prob(batch)
        out.batch.pop(keys.ENTROPYS, None)
        batch.union(out)
    with timer("ref", timing):
        batch.union(worker.compute_ref_log_prob(batch))
    scores = batch.batch[keys.TOKEN_LEVEL_SCORES]
    adv, ret = compute_advantage(scores, batch.batch[keys.RESPONSE_MASK], "grpo",
                                 index=batch.non_tensor_batch[keys.UID])
    batch.batch[keys.ADVANTAGES], batch.batch[keys.RETURNS] = adv, ret
    if warm_update:  # first update allocates the optimizer state
        worker.update_actor(batch)
    with timer("update_actor", timing):
        metrics = worker.update_actor(batch).meta_info[keys.META_METRICS]
    timing["update_weights"] = float(metrics["timing_s/update_weights"])
    timing["update_actor_only"] = timing["update_actor"] - timing["update_weights"]
    return timing


def bare_limits_by_micro(model_dir: Path, args: argparse.Namespace, micros: list[int]) -> dict[str, Any]:
    """bench_limits' bare fwd and fwd+bwd+AdamW loops at several micro sizes, in this process."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.bfloat16,
                                                 attn_implementation="sdpa").cuda()
    if args.grad_ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    rows = args.prompts[0] * args.n
    ids = torch.randint(10, 150000, (rows, args.prompt_len + args.response_len),
                        generator=torch.Generator().manual_seed(rows)).pin_memory()
    res: dict[str, Any] = {"fwd": {}, "train": {}}
    for micro in micros:
        res["fwd"][str(micro)] = bench_limits.bare_forward(model, ids, args.prompt_len, micro)
        res["train"][str(micro)] = bench_limits.bare_train(model, ids, args.prompt_len, micro,
                                                           args.mini_prompts * args.n)
        print(f"[bare] micro {micro}: fwd {res['fwd'][str(micro)]['s']:.2f}s "
              f"train {res['train'][str(micro)]['s']:.2f}s", flush=True)
    del model
    return res


def sweep_result(args: argparse.Namespace, res: dict[str, Any], env: dict[str, Any] | None = None
                 ) -> harness.Result:
    """The harness result of a `--sweep` run so far: one metric per setting and phase (each timed once)."""
    out = harness.Result("micro_sweep", harness.command_line(), 1, env=env or harness.environment())
    for row in res.get("sweep", []):
        for phase, seconds in row["step_s"].items():
            out.timing(f"sweep_{row['spec']}_{phase}_s", [seconds])
    out.extra.update(res)
    return out


def run_sweep(worker: Any, args: argparse.Namespace, model_dir: Path, vocab: int, res: dict[str, Any],
              out: Path, env: dict[str, Any]) -> None:
    """One generation, then each --sweep setting on it; bare loops last (the engine is asleep)."""
    n_prompts = args.prompts[0]
    gen_in = prompt_batch(bench_limits.random_prompts(n_prompts, args.prompt_len, seed=n_prompts, high=vocab),
                          args.n)
    gen_in.meta_info.update({keys.META_DO_SAMPLE: True, keys.META_VALIDATE: False})
    base = worker.generate_sequences(gen_in)
    scores = torch.zeros(base.batch[keys.RESPONSE_MASK].shape)
    scores[:, -1] = (base.batch[keys.RESPONSES] % 7 == 0).float().mean(-1)
    base.batch[keys.TOKEN_LEVEL_SCORES] = scores
    base.batch[keys.TOKEN_LEVEL_REWARDS] = scores
    res["sweep"] = []
    tokens = n_prompts * args.n * (args.prompt_len + args.response_len)
    for i, spec in enumerate(args.sweep):
        s = parse_setting(spec)
        step = sweep_setting(worker, base, s, warm_update=i == 0)
        res["sweep"].append({"spec": spec, "setting": s, "step_s": step,
                             "update_tokens_per_s": tokens / step["update_actor_only"]})
        print(f"[sweep] {spec}: " + " ".join(f"{k}={v:.2f}s" for k, v in step.items()), flush=True)
        sweep_result(args, res, env).write(path=out)
    micros = sorted({parse_setting(spec)["tm"] for spec in args.sweep} | set(args.bare_micros))
    res["bare"] = bare_limits_by_micro(model_dir, args, micros)
    train8 = res["bare"]["train"][str(min(micros))]["s"]
    for row in res["sweep"]:
        row["update_ratio_vs_bare_micro_%d" % min(micros)] = train8 / row["step_s"]["update_actor_only"]
    res["peak_mem_GB"] = lifetime_peaks()[0] / 1e9  # across the workers' per-phase counter resets
    print(f"[sweep] wrote {sweep_result(args, res, env).write(path=out)}", flush=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--response-len", type=int, default=512)
    ap.add_argument("--fwd-micro", type=int, default=32)
    ap.add_argument("--train-micro", type=int, default=32)
    ap.add_argument("--reps", type=int, default=3, help="measured steps per batch size (phase medians count)")
    ap.add_argument("--mini-prompts", type=int, default=64)
    ap.add_argument("--grad-ckpt", type=int, default=1)
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    ap.add_argument("--max-num-batched-tokens", type=int, default=16384)
    ap.add_argument("--enforce-eager", type=lambda s: s.lower() in ("1", "true"), default=False)
    ap.add_argument("--warmup-prompts", type=int, default=None,
                    help="prompts of the untimed first step (default: one mini-batch)")
    ap.add_argument("--limits-json", type=Path, default=None,
                    help="limits from bench_limits.py run just before on the same GPU (same flags)")
    ap.add_argument("--skip-limits", action="store_true", help="rlpost step only (e.g. on CPU)")
    ap.add_argument("--tiny", action="store_true", help="tiny model instead of Qwen2.5-0.5B (smoke test)")
    ap.add_argument("--override", nargs="*", default=[], help="extra Hydra overrides")
    ap.add_argument("--out-dir", type=Path, default=None, help="default benchmarks/results/<date>_<gpu|cpu>")
    ap.add_argument("--json-out", type=Path, default=None)
    ap.add_argument("--sweep", nargs="+", default=None, metavar="SPEC",
                    help="instead of full steps: one generation of --prompts[0] x n, then per SPEC "
                         "('tm=16,fm=16,dyn=0,rmpad=1': train micro rows, log-prob micro rows, dynamic-bsz "
                         "token cap (0 = off), use_remove_padding) old_log_prob/ref/update_actor, then bare "
                         "fwd/train loops at each micro size (no bench_limits subprocess)")
    ap.add_argument("--bare-micros", type=int, nargs="*", default=[],
                    help="extra micro sizes for the bare loops of --sweep")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with tempfile.TemporaryDirectory() as tmp:
        if args.tiny:
            from rlpost.utils.tiny_model import build_tiny_model

            model_dir = build_tiny_model(Path(tmp) / "tiny")
        else:
            model_dir = bench_limits.build_model(Path(tmp) / "qwen05_random")
        env = harness.environment()
        out_dir = args.out_dir or harness.session_dir(harness.RESULTS, env)
        out_dir.mkdir(parents=True, exist_ok=True)
        lim_path = out_dir / "limits.json"  # bench_limits' own file, beside this result
        if args.sweep:
            limits = None
        elif args.limits_json is not None:  # measured earlier on this same machine and GPU
            limits = json.loads(args.limits_json.read_text())
        else:
            limits = None if args.skip_limits else run_limits(args, model_dir, lim_path)
        start = time.perf_counter()
        worker = start_worker(grpo_config(model_dir, args), device)
        res: dict[str, Any] = {"args": harness.params(args), "worker_init_s": time.perf_counter() - start,
                               "targets": TARGETS, "per_batch": {}}
        from transformers import AutoConfig

        vocab = min(150000, AutoConfig.from_pretrained(model_dir).vocab_size)
        if args.sweep:
            out = args.json_out or out_dir / "micro_sweep.json"
            return run_sweep(worker, args, model_dir, vocab, res, out, env)
        warm = args.warmup_prompts or args.mini_prompts
        grpo_step(worker, bench_limits.random_prompts(warm, args.prompt_len, 1, high=vocab), args.n)
        for n_prompts in args.prompts:
            prompts = bench_limits.random_prompts(n_prompts, args.prompt_len, seed=n_prompts, high=vocab)
            steps = [grpo_step(worker, prompts, args.n) for _ in range(args.reps)]
            step = {k: float(np.median([s[k] for s in steps])) for k in steps[0]}
            rows = n_prompts * args.n
            entry: dict[str, Any] = {"step_s": step, "all_step_s": steps,
                                     "sync_breakdown_s": getattr(worker.rollout, "last_sync_breakdown", None),
                                     "tokens_per_s": {
                "gen": rows * args.response_len / step["gen"],
                "old_log_prob": rows * (args.prompt_len + args.response_len) / step["old_log_prob"],
                "ref": rows * (args.prompt_len + args.response_len) / step["ref"],
                "update_actor": rows * (args.prompt_len + args.response_len) / step["update_actor_only"],
                "step": rows * (args.prompt_len + args.response_len) / step["step"]}}
            if limits is not None:
                lim = limits["per_batch"][str(n_prompts)]
                entry["limits"] = lim
                entry["ratios"] = ratios(step, lim, limits["reload"])
            res["per_batch"][str(n_prompts)] = entry
            print(f"[grpo] {n_prompts}x{args.n}: " + " ".join(f"{k}={v:.2f}s" for k, v in step.items()), flush=True)
            if "ratios" in entry:
                print("[grpo] ratios: " + " ".join(f"{k}={v:.2f}" for k, v in entry["ratios"].items()), flush=True)
            _write(res, limits, args, out_dir, env)


def build_result(args: argparse.Namespace, res: dict[str, Any], env: dict[str, Any] | None = None
                 ) -> harness.Result:
    """The harness result of the batch sizes measured so far: per batch a timing metric per phase over the
    measured steps, and each limit / rlpost ratio with its target."""
    out = harness.Result("grpo_step", harness.command_line(), args.reps, env=env or harness.environment())
    for n_prompts, entry in res["per_batch"].items():
        tag = f"{n_prompts}x{args.n}"
        phases = dict.fromkeys(k for s in entry["all_step_s"] for k in s if k != "tokens")
        for phase in phases:  # gen's own split (wake, engine, sleep) only where the worker reported it
            out.timing(f"{tag}_{phase}_s", [s[phase] for s in entry["all_step_s"] if phase in s])
        for phase, ratio in entry.get("ratios", {}).items():
            target = TARGETS.get(phase, TARGETS["step_over_sum_limits_max"] if phase == "step_over_sum_limits"
                                 else None)
            out.metric(f"{tag}_ratio_{phase}", ratio, unit="limit/rlpost" if phase != "step_over_sum_limits"
                       else "step/sum of limits", target=target)
    out.extra.update(res)
    return out


def _write(res: dict[str, Any], limits: dict[str, Any] | None, args: argparse.Namespace, out_dir: Path,
           env: dict[str, Any]) -> None:
    """Write the results so far (after every batch size: a run cut short keeps what it measured)."""
    if limits is not None:
        res["limits"] = {k: v for k, v in limits.items() if k != "per_batch"}
    res["peak_mem_GB"] = lifetime_peaks()[0] / 1e9 if torch.cuda.is_available() else None  # across phase resets
    path = build_result(args, res, env).write(session=out_dir, path=args.json_out)
    print(f"[grpo] wrote {path}", flush=True)


if __name__ == "__main__":
    main()
