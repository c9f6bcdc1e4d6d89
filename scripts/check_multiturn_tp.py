"""Multi-turn rollouts on a real engine with tensor parallelism 2 against the same rows on one TP-1 engine.

Greedy agent loops (`tool_agent` with the calculator tool) on the first `--rows` prompts of a parquet file:

    # TP 2: two ranks share one engine (vLLM external_launcher; on CPU over gloo, on GPU over NCCL)
    torchrun --nproc_per_node 2 scripts/check_multiturn_tp.py --model M --data D/test.parquet --out /tmp/mt_tp
    # TP 1 on the same rows, then the comparison (a JSON line; exit status 1 when the batches differ)
    python scripts/check_multiturn_tp.py --model M --data D/test.parquet --out /tmp/mt_tp

`--device cuda --engine sglang` runs SGLang (GPU only). The TP-2 run goes through the worker's own path
(`AgentRollout.generate_in_block`: the first rank runs all agent loops, the peer follows its engine calls); each
rank hands in half of the rows, as the trainer's shards would. Written under --out: tp2.pt / tp1.pt (the batch
tensors and the trajectories' turns) and the comparison.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
TOOLS = REPO / "examples" / "multiturn" / "config" / "tool_config" / "calculator_tool_config.yaml"
KEYS = ("responses", "response_mask", "attention_mask", "input_ids")


def rollout_config(engine: str, tp: int, device: str, prompt_len: int, response_len: int):
    from hydra import compose, initialize_config_dir

    from rlpost.trainer.config import CONFIG_DIR, validate_config

    arr = "actor_rollout_ref"
    overrides = [f"trainer.device={device}", "trainer.n_gpus_per_node=2", "data.train_batch_size=4",
                 f"data.max_prompt_length={prompt_len}", f"data.max_response_length={response_len}",
                 f"{arr}.rollout.name={engine}", f"{arr}.rollout.tensor_model_parallel_size={tp}",
                 f"{arr}.rollout.dtype=float32", f"{arr}.rollout.load_format=hf",
                 f"{arr}.rollout.gpu_memory_utilization=0.3", f"{arr}.rollout.free_cache_engine=false",
                 f"{arr}.rollout.multi_turn.enable=true", f"{arr}.rollout.multi_turn.tool_config_path={TOOLS}",
                 f"{arr}.rollout.multi_turn.max_assistant_turns=4",
                 f"{arr}.actor.ppo_mini_batch_size=4", f"{arr}.actor.ppo_micro_batch_size_per_gpu=2",
                 "critic.ppo_micro_batch_size_per_gpu=2"]
    with initialize_config_dir(str(CONFIG_DIR), version_base=None):
        cfg = compose("ppo_trainer", overrides=overrides)
    return validate_config(cfg).actor_rollout_ref.rollout


def prompts(data: str, rows: int, tokenizer):
    import pandas as pd

    from rlpost.protocol import DataProto

    df = pd.read_parquet(data).head(rows)
    chats = np.empty(len(df), dtype=object)
    chats[:] = [list(p) for p in df["prompt"]]
    names = np.array(list(df["agent_name"]) if "agent_name" in df else ["tool_agent"] * len(df), dtype=object)
    return DataProto.from_dict(non_tensors={"raw_prompt": chats, "agent_name": names},
                               meta_info={"eos_token_id": tokenizer.eos_token_id,
                                          "pad_token_id": tokenizer.pad_token_id, "validate": True, "do_sample": False})


def run(args) -> dict:
    from transformers import AutoTokenizer

    from rlpost.rollout import build_rollout
    from rlpost.utils.distributed import consecutive_groups, init_distributed
    from rlpost.workers.agent_rollout import AgentRollout

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world not in (1, 2):
        raise SystemExit(f"WORLD_SIZE={world}: run with 1 process (TP 1) or torchrun --nproc_per_node 2 (TP 2)")
    group, tp_rank, rank = None, 0, 0
    if world == 2:
        init_distributed(args.device)
        group, tp_rank = consecutive_groups(2)
        rank = tp_rank
    tok = AutoTokenizer.from_pretrained(args.model)
    cfg = rollout_config(args.engine, world, args.device, args.prompt_length, args.response_length)
    start = time.perf_counter()
    rollout = build_rollout(cfg, args.model, tok, args.device)
    started = time.perf_counter()
    agent = AgentRollout(cfg, tok)
    batch = prompts(args.data, args.rows, tok)
    if world == 2:  # each rank hands in its half, as the trainer's data-parallel shards
        half = len(batch) // 2
        batch = batch.slice(rank * half, (rank + 1) * half)
    out = agent.generate_in_block(rollout, batch, group, tp_rank)
    done = time.perf_counter()
    result = {"tensors": {k: out.batch[k] for k in KEYS}, "turns": out.non_tensor_batch["__num_turns__"].tolist(),
              "engine_start_s": started - start, "generate_s": done - started}
    if world == 2:
        import torch.distributed as dist

        parts: list = [None, None]
        dist.all_gather_object(parts, result, group=group)
        result = {"tensors": {k: torch.cat([p["tensors"][k] for p in parts]) for k in KEYS},
                  "turns": parts[0]["turns"] + parts[1]["turns"], "engine_start_s": result["engine_start_s"],
                  "generate_s": result["generate_s"]}
    return result


def compare(tp1: dict, tp2: dict) -> dict:
    rows = len(tp1["turns"])
    same = [all(torch.equal(tp1["tensors"][k][i], tp2["tensors"][k][i]) for k in KEYS) for i in range(rows)]
    return {"rows": rows, "rows_identical": sum(same), "turns_tp1": tp1["turns"], "turns_tp2": tp2["turns"],
            "tool_turn_rows": sum(t > 2 for t in tp1["turns"]), "generate_s": {"tp1": round(tp1["generate_s"], 2),
                                                                                "tp2": round(tp2["generate_s"], 2)}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="HF model folder whose chat template lists tools")
    parser.add_argument("--data", required=True, help="parquet with `prompt` chat messages (and `agent_name`)")
    parser.add_argument("--out", required=True, help="folder for tp1.pt, tp2.pt and compare.json")
    parser.add_argument("--rows", type=int, default=8, help="prompts (even: half per rank at TP 2)")
    parser.add_argument("--engine", default="vllm", choices=["vllm", "sglang"])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--prompt_length", type=int, default=200)
    parser.add_argument("--response_length", type=int, default=96)
    args = parser.parse_args(argv)
    if args.rows % 2:
        parser.error(f"--rows={args.rows}: must be even (half per rank at TP 2), e.g. --rows={args.rows + 1}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    result = run(args)
    if int(os.environ.get("RANK", "0")) != 0:
        return 0
    torch.save(result, out / f"tp{world}.pt")
    if world == 2 or not (out / "tp2.pt").exists():
        print(f"tp{world}: {len(result['turns'])} rows in {result['generate_s']:.2f} s, turns {result['turns']}")
        return 0
    summary = compare(result, torch.load(out / "tp2.pt", weights_only=False))
    (out / "compare.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary))
    return 0 if summary["rows_identical"] == summary["rows"] else 1


if __name__ == "__main__":
    sys.exit(main())
