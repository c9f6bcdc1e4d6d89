"""Where the actor update's time goes on one GPU: rlpost's `update_actor` vs bare training loops.

    python benchmarks/bench_update_profile.py --prompts 64 --n 8      # GPU host, no vLLM needed

Same random Qwen2.5-0.5B-architecture model, tokens and micro/mini-batch sizes as bench_grpo_step.py.
Times (each after a warm-up mini-batch): rlpost update as configured (fp32 master weights, bf16 compute,
reshard_after_forward=true); the same with reshard_after_forward=false; the bare bf16 loop of
bench_limits.py (the "limit"); a bare loop with fp32 params under bf16 autocast (rlpost's precision without
FSDP). Last (CUPTI can slow what runs after it), a torch.profiler pass over one rlpost mini-batch: the top
ops by device time and by launch count, and the device-busy total against the wall time. Writes one
`benchmarks.harness` result, `benchmarks/results/<date>_<gpu>/update_profile.json` (or `--json-out`): one metric
per timed loop (one repetition each), the profile under `profile`.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.append(str(REPO))
sys.path.append(str(REPO / "benchmarks"))

import bench_grpo_step as grpo  # noqa: E402
import bench_limits  # noqa: E402

from benchmarks import harness  # noqa: E402
from rlpost import keys  # noqa: E402
from rlpost.protocol import DataProto  # noqa: E402


def update_batch(rows: int, prompt_len: int, response_len: int) -> DataProto:
    """Fixed-length rows as the rollout returns them, with old/ref log-probs and GRPO-like advantages."""
    g = torch.Generator().manual_seed(rows)
    t = prompt_len + response_len
    ids = torch.randint(10, 150000, (rows, t), generator=g)
    return DataProto.from_dict(tensors={
        keys.INPUT_IDS: ids, keys.ATTENTION_MASK: torch.ones(rows, t, dtype=torch.long),
        keys.POSITION_IDS: torch.arange(t).expand(rows, t).clone(), keys.RESPONSES: ids[:, prompt_len:],
        keys.RESPONSE_MASK: torch.ones(rows, response_len, dtype=torch.long),
        keys.OLD_LOG_PROBS: torch.full((rows, response_len), -12.0),
        keys.REF_LOG_PROB: torch.full((rows, response_len), -12.0),
        keys.ADVANTAGES: torch.randn(rows, response_len, generator=g)})


def bare_autocast_train(model_dir: Path, ids: torch.Tensor, args: argparse.Namespace) -> float:
    """bench_limits.bare_train with fp32 params and bf16 autocast (rlpost's precision, no FSDP)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32,
                                                 attn_implementation="sdpa").cuda()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    with torch.autocast("cuda", dtype=torch.bfloat16):
        return bench_limits.bare_train(model, ids, args.prompt_len, args.train_micro, args.mini_prompts * args.n)["s"]


def profile_update(worker, batch: DataProto) -> dict:
    """torch.profiler over one `update_actor`: top ops by device time and by count, busy vs wall time."""
    return profile_call(lambda: worker.update_actor(batch))


def profile_call(fn: Any, label: str = "profile") -> dict:
    """torch.profiler over one call of `fn` on the GPU: top ops by device time and by count, busy vs wall time."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    start = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    wall = time.perf_counter() - start
    events = prof.key_averages()
    busy_us = sum(e.self_device_time_total for e in events)
    launches = sum(e.count for e in events if e.self_device_time_total > 0)
    by_time = events.table(sort_by="self_cuda_time_total", row_limit=25)
    by_count = events.table(sort_by="count", row_limit=25)
    print(by_time, by_count, sep="\n", flush=True)
    print(f"[{label}] wall {wall:.2f}s, device busy {busy_us / 1e6:.2f}s, ops with device time {launches}",
          flush=True)
    return {"profile_wall_s": wall, "profile_device_busy_s": busy_us / 1e6, "profile_device_ops": launches,
            "profile_top_by_time": by_time, "profile_top_by_count": by_count}


TIMES = ("rlpost_update_s", "rlpost_update_no_reshard_s", "bare_bf16_s", "bare_fp32_autocast_s")


def build_result(args: argparse.Namespace, res: dict[str, Any], env: dict[str, Any] | None = None) -> harness.Result:
    """The harness result of `res`: one metric per timed loop (each timed once), the profile's numbers and
    tables kept under `profile`."""
    out = harness.Result("update_profile", harness.command_line(), 1, env=env or harness.environment())
    for name in TIMES:
        if name in res:
            out.timing(name, [res[name]])
    out.extra.update(args=harness.params(args), rows=res["rows"],
                     profile={k: v for k, v in res.items() if k.startswith("profile_")})
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, default in (("prompts", 64), ("n", 8), ("prompt-len", 512), ("response-len", 512),
                          ("train-micro", 32), ("fwd-micro", 32), ("mini-prompts", 64), ("grad-ckpt", 1)):
        ap.add_argument(f"--{name}", type=int, default=default)
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    ap.add_argument("--max-num-batched-tokens", type=int, default=16384)
    ap.add_argument("--enforce-eager", default=False)
    ap.add_argument("--override", nargs="*", default=[])
    ap.add_argument("--json-out", type=Path, default=None)
    args = ap.parse_args(argv)
    rows = args.prompts * args.n
    res: dict = {"rows": rows}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = bench_limits.build_model(Path(tmp) / "qwen05_random")
        cfg = grpo.grpo_config(model_dir, args)
        import os

        from rlpost.workers.fsdp_workers import ActorRolloutRefWorker

        for key, val in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                         "MASTER_PORT": "29533", "RLPOST_DEVICE": "cuda"}.items():
            os.environ.setdefault(key, val)

        w = ActorRolloutRefWorker(cfg.actor_rollout_ref, role="actor")
        w.init_model()
        warm = update_batch(args.mini_prompts * args.n, args.prompt_len, args.response_len)
        batch = update_batch(rows, args.prompt_len, args.response_len)
        w.update_actor(warm)
        res["rlpost_update_s"] = harness.timed(lambda: w.update_actor(batch), torch.cuda.synchronize)[0]
        w.actor_module.set_reshard_after_forward(False)
        w.update_actor(warm)
        res["rlpost_update_no_reshard_s"] = harness.timed(lambda: w.update_actor(batch), torch.cuda.synchronize)[0]
        w.actor_module.set_reshard_after_forward(True)
        ids = batch.batch[keys.INPUT_IDS].pin_memory()
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.bfloat16,
                                                     attn_implementation="sdpa").cuda()
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        res["bare_bf16_s"] = bench_limits.bare_train(model, ids, args.prompt_len, args.train_micro,
                                                     args.mini_prompts * args.n)["s"]
        del model
        torch.cuda.empty_cache()
        res["bare_fp32_autocast_s"] = bare_autocast_train(model_dir, ids, args)
        torch.cuda.empty_cache()
        print("[profile] " + json.dumps({k: v for k, v in res.items() if k.endswith("_s")}), flush=True)
        res.update(profile_update(w, warm))
    print("[profile] " + json.dumps({k: v for k, v in res.items() if k.endswith("_s")}), flush=True)
    print(f"[profile] wrote {build_result(args, res).write(path=args.json_out)}", flush=True)


if __name__ == "__main__":
    main()
