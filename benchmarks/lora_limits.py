"""Bare limits of a LoRA GRPO step's phases: generation with the adapter, log-probs with and without it, the update.

    python -m benchmarks.lora_limits --model-dir /tmp/model_7b --data /tmp/d/train.parquet --prompts 8 --n 8 \\
        --response-len 256 --rank 32 --json-out /tmp/lora_limits.json                                # GPU host

What `bench_lora.py`'s `lora_adapter` run does each step, with no framework around it, in one process:
  - gen: bare vLLM (its defaults; `--enforce-eager` as the run) serving a rank-`--rank` all-linear PEFT adapter
    (`enable_lora`, one slot), prompts x n requests of exactly `--response-len` tokens (ignore_eos); the prompts
    are the first `--prompts` rows of `--data` through the tokenizer's chat template, as the dataset renders them;
  - fwd: the log-prob pass with the adapter on (old_log_prob), ref: the same with the adapter off (the reference
    policy of a LoRA actor); both packed (`strong_limits.pack`, packed attention, the fused log-prob head, eager);
  - train: forward + backward over the same packed rows and one fused AdamW step of the float32 adapters (the base
    frozen in bf16), gradient checkpointing as `--grad-ckpt`.
The limits' sum (`sum_s`: the sum of the four medians) is what `bench_lora.py --limits` divides the step time by
(goal E2). The adapter sync is left out of the sum (the step's `update_weights` is timed, the bound taken as 0).
Writes one harness result (`--json-out`, else `benchmarks/results/<date>_<gpu>/lora_limits.json`).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from benchmarks import harness

REPO = Path(__file__).resolve().parents[1]
sys.path.append(str(REPO / "benchmarks"))
PHASES = ("gen", "fwd", "ref", "train")


def chat_prompts(model_dir: Path, data: Path, prompts: int) -> list[list[int]]:
    """Token ids of the first `prompts` rows' `prompt` messages through the tokenizer's chat template."""
    import pandas as pd
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    rows = pd.read_parquet(data)["prompt"].tolist()[:prompts]
    if len(rows) < prompts:
        raise SystemExit(f"--data {data}: {len(rows)} rows, fewer than --prompts {prompts}")
    out = []
    for msgs in rows:
        ids = tok.apply_chat_template([dict(m) for m in msgs], add_generation_prompt=True, tokenize=True)
        out.append(list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids))
    return out


def lora_model(model_dir: Path, rank: int, device: str, grad_ckpt: bool) -> tuple[Any, Any]:
    """(PEFT model, the causal LM inside it holding the adapters): bf16 base frozen, float32 adapters (lora_B = 0,
    as a fresh rlpost adapter), packed attention."""
    from peft import LoraConfig, get_peft_model

    from benchmarks.strong_limits import load_model

    base, _ = load_model(model_dir, device, grad_ckpt, liger=False)
    cfg = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules="all-linear", lora_dropout=0.0, bias="none",
                     task_type="CAUSAL_LM")
    peft_model = get_peft_model(base, cfg)
    for p in peft_model.parameters():
        if p.requires_grad:
            p.data = p.data.float()
    if grad_ckpt:
        base.enable_input_require_grads()  # checkpointed blocks of a frozen embedding still get a gradient path
    return peft_model, peft_model.base_model.model


def generate_limit(args: argparse.Namespace, prompts: list[list[int]], adapter: str, device: str) -> dict:
    """Median and every time of `--reps` generations through bare vLLM with the adapter; the engine then sleeps."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from vllm import LLM, SamplingParams
    from vllm.lora.request import LoRARequest

    start_s, llm = harness.timed(lambda: LLM(
        model=str(args.model_dir), dtype="bfloat16", seed=0, max_model_len=max(map(len, prompts)) + args.response_len,
        gpu_memory_utilization=args.gpu_memory_utilization, enforce_eager=bool(args.enforce_eager),
        enable_sleep_mode=device == "cuda", enable_lora=True, max_loras=1,
        max_lora_rank=max(args.rank, 8)))
    requests = [{"prompt_token_ids": prompts[i // args.n]} for i in range(len(prompts) * args.n)]
    params = SamplingParams(n=1, temperature=1.0, max_tokens=args.response_len, ignore_eos=True, detokenize=False)
    lora = LoRARequest("bench", 1, adapter)
    sync = torch.cuda.synchronize if device == "cuda" else None
    times, tokens = [], 0
    for i in range(args.reps + 1):  # the first one warms up
        seconds, outs = harness.timed(lambda: llm.generate(requests, params, lora_request=lora, use_tqdm=False), sync)
        tokens = sum(len(o.outputs[0].token_ids) for o in outs)
        if i:
            times.append(seconds)
    assert tokens == len(requests) * args.response_len, f"bare vLLM generated {tokens} tokens"
    if device == "cuda":
        llm.sleep(level=1)  # KV cache freed, weights to the host: the loops get the memory
    return {"times": times, "engine_start_s": start_s, "gen_tokens": tokens, "llm": llm}


def loop_limits(args: argparse.Namespace, peft_model: Any, inner: Any, seqs: list, device: str) -> dict:
    """Times of the log-prob pass with the adapter (fwd), without it (ref) and of the adapter update (train)."""
    from benchmarks.strong_limits import forward_pass, pack, train_pass
    from rlpost.engine.fused_logprob import FusedHeadOptions, eager

    # the fused head in eager mode: no torch.compile of the per-chunk maths, whose two compilations would not
    # fit the session's time (the head is ~7 % of a 7B model's FLOPs)
    fwd_opts = FusedHeadOptions(temperature=1.0, with_entropy=True, chunk=8192, compile_fn=eager)
    train_opts = FusedHeadOptions(temperature=1.0, with_entropy=False, chunk=8192, compile_fn=eager)
    fwd_rows, train_rows = pack(seqs, args.fwd_tokens, device), pack(seqs, args.train_tokens, device)
    g = torch.Generator().manual_seed(0)
    adv = [torch.randn(r.where.numel(), generator=g).to(device) for r in train_rows]
    opt = torch.optim.AdamW([p for p in peft_model.parameters() if p.requires_grad], lr=1e-5,
                            fused=device == "cuda")
    sync = torch.cuda.synchronize if device == "cuda" else None

    def ref() -> None:
        with peft_model.disable_adapter():
            forward_pass(inner, fwd_rows, fwd_opts)

    fns = {"fwd": lambda: forward_pass(inner, fwd_rows, fwd_opts), "ref": ref,
           "train": lambda: train_pass(inner, opt, train_rows, adv, train_opts)}
    out: dict[str, list[float]] = {}
    for name, fn in fns.items():
        fn()  # warm-up: compilation, allocator, optimiser state
        out[name] = [harness.timed(fn, sync)[0] for _ in range(args.reps)]
    return out


def run(args: argparse.Namespace) -> harness.Result:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    prompts = chat_prompts(args.model_dir, args.data, args.prompts)
    peft_model, inner = lora_model(args.model_dir, args.rank, device, bool(args.grad_ckpt))
    adapter = tempfile.mkdtemp(prefix="lora_limits_")
    peft_model.save_pretrained(adapter)
    gen = generate_limit(args, prompts, adapter, device)
    g = torch.Generator().manual_seed(1)
    seqs = [(prompts[i // args.n], torch.randint(10, args.vocab, (args.response_len,), generator=g).tolist())
            for i in range(len(prompts) * args.n)]
    times = {"gen": gen["times"], **loop_limits(args, peft_model, inner, seqs, device)}
    res = harness.Result("lora_limits", harness.command_line(), args.reps)
    for name in PHASES:
        res.timing(f"{name}_s", times[name])
    total = sum(res.metrics[f"{name}_s"]["value"] for name in PHASES)
    res.metric("sum_s", total, unit="s", values=[], parts=list(PHASES))
    trainable = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    res.extra.update(args=harness.params(args), prompt_tokens=[len(p) for p in prompts],
                     prompt_mean=sum(map(len, prompts)) / len(prompts), engine_start_s=gen["engine_start_s"],
                     gen_tokens=gen["gen_tokens"], trainable_params=trainable,
                     params=sum(p.numel() for p in peft_model.parameters()))
    return res


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from benchmarks import strong_limits

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-dir", type=Path, required=True)
    ap.add_argument("--data", type=Path, required=True, help="the run's train.parquet (its `prompt` messages)")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--response-len", type=int, default=512)
    ap.add_argument("--rank", type=int, default=32)
    ap.add_argument("--reps", type=int, default=3)
    strong_limits.add_arguments(ap, prompt_len=False)
    ap.add_argument("--enforce-eager", type=int, default=0)
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    ap.add_argument("--json-out", type=Path, default=None)
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> Path:
    from transformers import AutoConfig

    args = parse_args(argv)
    args.vocab = min(150000, AutoConfig.from_pretrained(args.model_dir).vocab_size)
    res = run(args)
    path = res.write(path=args.json_out)
    print(f"[lora_limits] sum {res.metrics['sum_s']['value']:.3f}s "
          + ", ".join(f"{k} {res.metrics[f'{k}_s']['value']:.3f}s" for k in PHASES) + f" -> {path}", flush=True)
    return path


if __name__ == "__main__":
    main()
