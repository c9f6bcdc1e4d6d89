"""The LoRA adapter's hand-over to vLLM (`model.lora.merge=false`), two ways, on one in-process engine: through a
PEFT folder (`VLLMRollout.load_adapter`: written to /dev/shm, read back by vLLM) and in memory
(`VLLMRollout.load_adapter_tensors`). Times the engine side of `LoraSync.sync` (from CPU adapter tensors in the
engine dtype to the adapter served; the gather from FSDP, the same both ways, is left out).

    python -m benchmarks.bench_lora_sync --toy                                   # CPU: a built 4-layer model
    python -m benchmarks.bench_lora_sync --model-dir /tmp/model_7b --rank 32     # GPU host

Writes one harness result (`--json-out`, else `benchmarks/results/<date>_<gpu>/lora_sync.json`): `folder_s`,
`memory_s` (medians of `--reps` hand-overs after one warm-up each) and their ratio.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.append(str(REPO))

from benchmarks import harness  # noqa: E402


def adapter(model_dir: Path, rank: int, dtype: torch.dtype) -> tuple[dict[str, torch.Tensor], object]:
    """(PEFT-named tensors in `dtype`, LoraConfig) of a rank-`rank` all-linear adapter of the model (meta base)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    from rlpost.engine.lora import adapter_tensors

    with torch.device("meta"):
        base = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir))
    cfg = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules="all-linear", lora_dropout=0.0, bias="none",
                     task_type="CAUSAL_LM")
    model = get_peft_model(base, cfg).base_model.model
    gen = torch.Generator().manual_seed(0)
    named = ((n, torch.randn(p.shape, generator=gen) * 0.01) for n, p in model.named_parameters() if ".lora_" in n)
    return adapter_tensors(named, dtype), cfg


def rollout_config(args: argparse.Namespace, device: str):
    """`actor_rollout_ref.rollout` of the packaged `ppo_trainer` config (composed and validated), one small engine."""
    from hydra import compose, initialize_config_dir

    from rlpost.trainer.config import CONFIG_DIR, validate_config

    over = [f"trainer.device={device}", "trainer.n_gpus_per_node=1", "data.train_batch_size=8",
            "data.max_prompt_length=64", "data.max_response_length=16",
            "actor_rollout_ref.actor.ppo_mini_batch_size=8", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
            "critic.ppo_micro_batch_size_per_gpu=8", f"actor_rollout_ref.model.path={args.model_dir}",
            "actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
            f"actor_rollout_ref.rollout.dtype={args.dtype}", "actor_rollout_ref.rollout.enforce_eager=true",
            f"actor_rollout_ref.rollout.gpu_memory_utilization={args.gpu_mem}",
            "actor_rollout_ref.rollout.max_num_batched_tokens=1024"]
    with initialize_config_dir(str(CONFIG_DIR), version_base=None):
        return validate_config(compose("ppo_trainer", overrides=over)).actor_rollout_ref.rollout


def hand_over_times(rollout: Any, tensors: dict[str, torch.Tensor], peft_cfg: Any, reps: int, folder: str,
                    sync: Any = None) -> dict[str, list[float]]:
    """Seconds of `reps` hand-overs each way (after one warm-up round), alternated with the order swapped each
    round: "folder" writes `folder` and loads it, "memory" hands over a fresh copy of `tensors`."""
    from rlpost.engine.lora import save_adapter

    def folder_way() -> float:
        return harness.timed(lambda: rollout.load_adapter(save_adapter(folder, tensors, peft_cfg)), sync)[0]

    def memory_way() -> float:
        # the engine takes the tensors over (vLLM scales lora_B in place): a fresh dict each time, as LoraSync
        # makes one per sync; the copy is made before the clock starts
        fresh = {k: v.clone() for k, v in tensors.items()}
        return harness.timed(lambda: rollout.load_adapter_tensors(fresh, peft_cfg), sync)[0]

    times: dict[str, list[float]] = {"folder": [], "memory": []}
    for i in range(reps + 1):  # alternated, the order swapped each round; the first round warms up
        for way in (("folder", "memory") if i % 2 else ("memory", "folder")):
            times[way].append(folder_way() if way == "folder" else memory_way())
    return {way: t[1:] for way, t in times.items()}


def run(args: argparse.Namespace) -> harness.Result:
    from transformers import AutoTokenizer

    from rlpost.rollout import build_rollout

    device = "cuda" if torch.cuda.is_available() else "cpu"
    cfg = rollout_config(args, device)
    rollout = build_rollout(cfg, str(args.model_dir), AutoTokenizer.from_pretrained(args.model_dir), device,
                            lora_rank=args.rank)
    dtype = getattr(torch, args.dtype)
    tensors, peft_cfg = adapter(args.model_dir, args.rank, dtype)
    folder = tempfile.mkdtemp(prefix="lora_sync_", dir="/dev/shm" if os.access("/dev/shm", os.W_OK) else None)
    times = hand_over_times(rollout, tensors, peft_cfg, args.reps, folder,
                            torch.cuda.synchronize if device == "cuda" else None)
    res = harness.Result("lora_sync", harness.command_line(), args.reps)
    for way in times:
        res.timing(f"{way}_s", times[way])
    res.metric("memory_over_folder", res.metrics["memory_s"]["value"] / res.metrics["folder_s"]["value"],
               unit="ratio of medians", values=[])
    res.extra.update(args=harness.params(args), adapter_bytes=sum(t.numel() * t.element_size()
                                                                 for t in tensors.values()))
    return res


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-dir", type=Path, default=None)
    ap.add_argument("--toy", action="store_true", help="build a 4-layer, 896-wide model (CPU smoke)")
    ap.add_argument("--rank", type=int, default=32)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--dtype", default=None, help="engine dtype (default: bfloat16 on GPU, float32 on CPU)")
    ap.add_argument("--gpu-mem", type=float, default=0.5)
    ap.add_argument("--json-out", type=Path, default=None)
    args = ap.parse_args(argv)
    if (args.model_dir is None) == (not args.toy):
        ap.error("give --model-dir or --toy (one of them)")
    args.dtype = args.dtype or ("bfloat16" if torch.cuda.is_available() else "float32")
    return args


def main(argv: list[str] | None = None) -> Path:
    args = parse_args(argv)
    if args.toy:
        from rlpost.utils.tiny_model import build_tiny_model

        args.model_dir = build_tiny_model(tempfile.mkdtemp(prefix="lora_sync_model_"), hidden_size=896,
                                          num_layers=4, num_heads=14, num_kv_heads=2, intermediate_size=4864)
    res = run(args)
    path = res.write(path=args.json_out)
    m = res.metrics
    print(f"[lora_sync] folder {m['folder_s']['value'] * 1e3:.1f} ms, memory {m['memory_s']['value'] * 1e3:.1f} ms "
          f"({res.extra['adapter_bytes'] / 2**20:.1f} MiB adapter) -> {path}", flush=True)
    return path


if __name__ == "__main__":
    main()
