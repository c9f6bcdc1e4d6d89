"""Goal M1 (issue 49): an MoE model through `main_ppo` on several GPUs, with router replay off and on.

    python3 benchmarks/bench_moe.py --replay off --gpus 4 --layers 24 --out-dir $SESSION    # 4 GPUs, one call each
    python3 benchmarks/bench_moe.py --replay r2 --gpus 4 --layers 24 --out-dir $SESSION
    python3 benchmarks/bench_moe.py --replay r2 --device cpu --gpus 2 --prompts 4 --n 2 --cap 16 --steps 2 \\
        --out-dir /tmp/moe                                                                          # CPU

The model is Qwen3-30B-A3B's shape (hidden 2048, 32 query / 4 key-value heads of 128, 128 experts of width 768,
8 routed per token, vocabulary 151,936, untied head) with random bf16 weights and `--layers` of its 48 decoder
layers ("the largest that fits": at 48 layers FSDP's fp32 master weights, gradients and AdamW state alone take
~122 GB per GPU on 4 GPUs; 24 layers halve that), saved once to /tmp/m_moe_<layers>l. `--device cpu` takes
rlpost's tiny Qwen3-MoE (`rlpost.utils.tiny_model`, arch qwen3_moe) instead.

Every run is `examples/grpo_trainer/run_qwen2_5_0_5b_gpu.sh` (GRPO, KL loss) on `benchmarks/workload.py`'s
GSM8K-shaped prompts with long-tailed per-sample caps up to `--cap` (`ignore_eos`), one FSDP unit per decoder layer
(`FSDP_MIN_NUM_PARAMS=0`), the rollout with tensor parallelism `--rollout-tp`, four PPO mini-batches per step (so
the later ones are trained on by weights that have moved, where router replay matters), and the MoE load metrics
every step (`rollout.moe_load_balance_metrics_interval=1`). A random model's samples all score 0, so GRPO's
advantages are 0: an entropy bonus (`--entropy-coeff`, learning rate `--lr`) is what moves the weights between the
mini-batches. `--replay r2` adds `actor.router_replay.mode=R2`.

Per run (`<out-dir>/moe.json`, one entry per `--replay`): steps asked / done, step times, tokens/s/GPU
(`perf/throughput`), peak memory per GPU (`perf/max_memory_allocated_gb`, the worker's resident set on CPU),
update MFU by active parameters (6 x N_active x the step's tokens / update time / (989 TFLOP/s x GPUs); N_active
counts attention, router, the routed experts' share and the head, not the embedding lookup), the trainer's expert
load (`actor/moe/max_vio/avg`, `actor/moe/avg_vio/avg`), and the importance ratio's spread (`actor/log_ratio_std`,
`actor/ppo_kl`, `actor/pg_clipfrac`; with R2 `actor/router_replay/changed_fraction`). `benchmarks.goals_49` reads
the file for M1. Not built, and said so in the goal: expert parallelism (FSDP shards the experts with every other
weight; vLLM's tensor parallelism splits each expert) and the rollout's own expert load (the engine does not
report its routing: rollout routing replay is not built).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.append(str(Path(__file__).resolve().parent))

from main_ppo_runs import REPO, Run, launch  # noqa: E402

sys.path.append(str(REPO))

from benchmarks import harness  # noqa: E402

RESULT = "moe.json"
PEAK = 989e12  # H100/H200 dense bf16, the issues' MFU denominator
PROMPT_LEN = 192  # the workload's prompts are ~70-190 tokens
MINI_BATCHES = 4
# Qwen3-30B-A3B's config.json shape (its layers set by --layers)
QWEN3_30B_A3B = dict(hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768, num_attention_heads=32,
                     num_key_value_heads=4, head_dim=128, num_experts=128, num_experts_per_tok=8,
                     vocab_size=151936, tie_word_embeddings=False, max_position_embeddings=40960,
                     rope_theta=1e6, rms_norm_eps=1e-6, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[])
RUN_KEYS = ("actor/moe/max_vio/avg", "actor/moe/min_vio/avg", "actor/moe/avg_vio/avg", "actor/log_ratio_std",
            "actor/ppo_kl", "actor/pg_clipfrac", "actor/router_replay/changed_fraction", "perf/throughput",
            "perf/max_memory_allocated_gb", "perf/cpu_memory_used_gb", "timing_s/gen", "timing_s/update_actor",
            "timing_s/old_log_prob", "timing_s/update_weights", "response_length/mean")


def moe_params(cfg: dict[str, Any]) -> tuple[int, int]:
    """(total, active) parameters of a Qwen3-MoE shape; active counts what one token's forward multiplies by
    (attention, norms, router, its routed experts, the head), not the embedding lookup."""
    h, layers = cfg["hidden_size"], cfg["num_hidden_layers"]
    d = cfg.get("head_dim") or h // cfg["num_attention_heads"]
    q, kv = cfg["num_attention_heads"] * d, cfg["num_key_value_heads"] * d
    attn = h * q + 2 * h * kv + q * h + 2 * d + 2 * h  # q, k, v, o; q/k norms; the two layer norms
    experts = cfg.get("num_experts") or cfg.get("num_local_experts")
    expert = 3 * h * cfg["moe_intermediate_size"]
    router = h * experts
    embed = cfg["vocab_size"] * h
    head = 0 if cfg.get("tie_word_embeddings") else embed
    total = layers * (attn + router + experts * expert) + embed + head + h
    active = layers * (attn + router + cfg["num_experts_per_tok"] * expert) + (head or embed) + h
    return total, active


def build_model(out_dir: Path, layers: int, seed: int = 0) -> Path:
    """A random bf16 Qwen3-30B-A3B-shaped model of `layers` decoder layers + rlpost's small BPE tokenizer."""
    import torch
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    from rlpost.utils.tiny_model import build_tokenizer

    out_dir.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(out_dir)
    config = Qwen3MoeConfig(**QWEN3_30B_A3B, num_hidden_layers=layers, bos_token_id=tok.pad_token_id,
                            eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, dtype="bfloat16")
    torch.manual_seed(seed)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        torch.set_default_dtype(torch.bfloat16)
        model = Qwen3MoeForCausalLM(config)
        torch.set_default_dtype(torch.float32)
    model.save_pretrained(str(out_dir), safe_serialization=True)
    return out_dir


def ensure_model(args: argparse.Namespace) -> Path:
    """The run's model folder (built in a child process when missing: this process keeps no CUDA context)."""
    if args.model_dir is not None:
        return args.model_dir
    if args.device == "cpu":
        out = Path("/tmp/m_moe_tiny")
        code = f"from rlpost.utils.tiny_model import build_tiny_model; build_tiny_model({str(out)!r}, arch='qwen3_moe')"
    else:
        out = Path(f"/tmp/m_moe_{args.layers}l")
        code = (f"import sys; sys.path.insert(0, {str(REPO / 'benchmarks')!r}); from pathlib import Path; "
                f"import bench_moe; bench_moe.build_model(Path({str(out)!r}), {args.layers})")
    if not (out / "config.json").exists():
        subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)
    return out


def command(args: argparse.Namespace, data: Path, run_dir: Path) -> tuple[list[str], dict[str, str]]:
    mini = max(1, args.prompts // MINI_BATCHES)
    cmd = ["bash", "examples/grpo_trainer/run_qwen2_5_0_5b_gpu.sh",
           f"data.train_files={data / 'train.parquet'}", "data.val_files=null", f"data.train_batch_size={args.prompts}",
           f"data.max_prompt_length={PROMPT_LEN}", f"data.max_response_length={args.cap}", "data.shuffle=false",
           "actor_rollout_ref.rollout.ignore_eos=true", f"actor_rollout_ref.rollout.n={args.n}",
           f"actor_rollout_ref.rollout.tensor_model_parallel_size={args.rollout_tp}",
           f"actor_rollout_ref.actor.ppo_mini_batch_size={mini}",
           "actor_rollout_ref.rollout.moe_load_balance_metrics_interval=1",
           # random-weight samples all score 0, so GRPO's advantages are 0: an entropy bonus moves the weights
           f"actor_rollout_ref.actor.entropy_coeff={args.entropy_coeff}", f"actor_rollout_ref.actor.optim.lr={args.lr}",
           f"trainer.n_gpus_per_node={args.gpus}", f"trainer.total_training_steps={args.steps}",
           "trainer.test_freq=-1", "trainer.save_freq=-1", "trainer.val_before_train=false",
           "trainer.logger=[console,file]", f"trainer.experiment_name=moe_{args.replay}",
           f"trainer.default_local_dir={run_dir}"]
    if args.replay == "r2":
        cmd.append("actor_rollout_ref.actor.router_replay.mode=R2")
    if args.device == "cpu":
        cmd += ["trainer.device=cpu", "ray_init.num_cpus=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
                "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4"]
    cmd += args.override
    env = {"MODEL_PATH": str(args.model_dir), "DATA_DIR": str(data), "N_GPUS": str(args.gpus),
           "FSDP_MIN_NUM_PARAMS": "0"}  # one FSDP unit per decoder layer; verl's checkpointing and micro-batches
    return cmd, env


def _series(rows: list[dict[str, Any]], key: str) -> list[float]:
    return [float(r[key]) for r in rows if key in r]


def summarize_run(run: Run, args: argparse.Namespace, log: Path) -> dict[str, Any]:
    """The run's figures (module docstring), each as its per-step list and the median of steps 2.. (or step 1)."""
    rows = run.rows
    cfg = json.loads((args.model_dir / "config.json").read_text())
    total, active = moe_params(cfg)
    out: dict[str, Any] = {"replay": args.replay, "rc": run.rc, "timed_out": run.timed_out, "steps_asked": args.steps,
                           "steps_done": len(rows), "log": log.name, "startup_s": run.startup_s, "gpus": args.gpus,
                           "params_total": total, "params_active": active, "layers": cfg["num_hidden_layers"],
                           "step_s": _series(rows, "timing_s/step")}
    later = rows[1:] or rows
    for key in RUN_KEYS:
        vals = _series(rows, key)
        if vals:
            out[key] = vals
            out[f"{key}:median"] = statistics.median(_series(later, key) or vals)
    mfu = [6 * active * float(r["perf/total_num_tokens"]) / float(r["timing_s/update_actor"]) / (PEAK * args.gpus)
           for r in later if r.get("timing_s/update_actor") and r.get("perf/total_num_tokens")]
    if mfu:
        out["update_mfu_active"] = mfu
        out["update_mfu_active:median"] = statistics.median(mfu)
    return out


def build_result(runs: dict[str, dict[str, Any]]) -> harness.Result:
    res = harness.Result("moe", harness.command_line(), min((r["steps_done"] for r in runs.values()), default=0))
    for name, run in runs.items():
        if run["step_s"]:
            res.timing(f"{name}_step_s", run["step_s"])
        for key, unit in (("perf/throughput", "tokens/s/GPU"), ("update_mfu_active", "fraction"),
                          ("actor/log_ratio_std", "nats"), ("actor/moe/max_vio/avg", "deviation")):
            vals = run.get(key)
            if vals:
                res.metric(f"{name}_{key.replace('/', '_')}", statistics.median(vals), min(vals), max(vals),
                           unit=unit, values=vals, interval="range over the steps")
    res.extra["runs"] = runs
    return res


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replay", required=True, choices=["off", "r2"], help="router replay off, or R2")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--gpus", type=int, default=4, help="trainer.n_gpus_per_node (worker processes on CPU)")
    ap.add_argument("--rollout-tp", type=int, default=None, help="rollout tensor parallelism (default: --gpus on "
                    "cuda, 1 on cpu)")
    ap.add_argument("--layers", type=int, default=24, help="decoder layers of the 30B-A3B shape (48: the whole)")
    ap.add_argument("--model-dir", type=Path, default=None, help="a model of your own instead")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--cap", type=int, default=1024, help="the longest response (per-sample caps up to it)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--entropy-coeff", type=float, default=0.01, help="the only loss term that moves random weights")
    ap.add_argument("--timeout", type=int, default=560, help="seconds before the run is killed (it keeps its steps)")
    ap.add_argument("--override", nargs="*", default=[], help="extra Hydra overrides")
    ap.add_argument("--build-only", action="store_true", help="build the model folder (if missing) and stop")
    ap.add_argument("--out-dir", type=Path, required=True)
    args = ap.parse_args(argv)
    if args.rollout_tp is None:
        args.rollout_tp = args.gpus if args.device == "cuda" else 1
    if args.gpus % args.rollout_tp:
        ap.error(f"--rollout-tp={args.rollout_tp} must divide --gpus={args.gpus}, e.g. --rollout-tp {args.gpus}")
    if args.prompts < MINI_BATCHES or args.prompts % MINI_BATCHES:
        ap.error(f"--prompts={args.prompts}: a multiple of {MINI_BATCHES} (the step's PPO mini-batches), e.g. 64")
    return args


def main(argv: list[str] | None = None) -> Path:
    from benchmarks import workload

    args = parse_args(argv)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    args.model_dir = ensure_model(args)
    if args.build_only:
        print(f"[moe] model: {args.model_dir}", flush=True)
        return args.model_dir
    data = workload.ensure_parquet("moe_data", args.model_dir, args.prompts, args.n, args.cap, args.seed, args.steps)
    run_dir = Path(f"/tmp/moe_run_{args.replay}")
    subprocess.run(["rm", "-rf", str(run_dir)], check=True)
    run_dir.mkdir(parents=True)
    cmd, env = command(args, data, run_dir)
    log = args.out_dir / f"moe_{args.replay}.log"
    run = launch(cmd, env, run_dir, log, f"moe {args.replay}", timeout_s=args.timeout)
    path = args.out_dir / RESULT
    runs = json.loads(path.read_text()).get("runs", {}) if path.is_file() else {}
    runs[args.replay] = summarize_run(run, args, log)
    (args.out_dir / f"moe_{args.replay}_metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in run.rows))
    build_result(runs).write(path=path)
    print(f"[moe] {args.replay}: {json.dumps({k: v for k, v in runs[args.replay].items() if ':' in k})}\n"
          f"[moe] -> {path}", flush=True)
    return path


if __name__ == "__main__":
    main()
