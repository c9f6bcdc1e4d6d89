"""Bare limits of one GRPO step's phases on this GPU, without rlpost in the way.

    python benchmarks/bench_limits.py --prompts 64 128 --n 8 --prompt-len 512 --response-len 512

For a random-weight model of the Qwen2.5-0.5B architecture (bf16) it measures:
  - gen: vLLM offline generation (CUDA graphs, ignore_eos) of prompts x n fixed-length responses;
  - reload: vLLM's own in-place `reload_weights` of the same weights from GPU tensors (the issue's
    limit for the weight sync); also the model's plain `load_weights` of them ("load") and the
    weights-only wake-up after a level-2 sleep ("wake_weights"), the two parts of rlpost's sync;
  - sleep / wake_up: what `sleep(level=1)` frees (torch.cuda.mem_get_info) and how long both take;
  - fwd: a plain forward computing the response tokens' log-probs over the same tokens (micro-batches);
  - train: a plain forward + backward + fused AdamW loop over the same tokens (grad accumulation over
    micro-batches, one optimizer step per mini-batch).
Writes `benchmarks/results/<date>_<device>/limits.json` (or `--json-out`), in the harness schema.
`benchmarks/bench_grpo_step.py` runs this in a subprocess first, so the step and its limits come from the same run
on the same GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.append(str(REPO))  # after PYTHONPATH: a snapshot of rlpost put there wins

# Qwen2.5-0.5B's architecture (random weights; no model hub on the GPU host).
QWEN05 = dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
              intermediate_size=4864, vocab_size=151936, max_position_embeddings=32768, rope_theta=1000000.0,
              rms_norm_eps=1e-6, tie_word_embeddings=True)
# Qwen2.5-7B's architecture (random weights).
QWEN7 = dict(hidden_size=3584, num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
             intermediate_size=18944, vocab_size=152064, max_position_embeddings=32768, rope_theta=1000000.0,
             rms_norm_eps=1e-6, tie_word_embeddings=False)
ARCHS = {"0.5b": QWEN05, "7b": QWEN7}


def build_model(out_dir: str | Path, seed: int = 0, arch: str = "0.5b") -> Path:
    """Save a random-weight Qwen2.5-architecture model (`ARCHS[arch]`, bf16) + a small BPE tokenizer into out_dir."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from rlpost.utils.tiny_model import build_tokenizer

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(out)
    config = Qwen2Config(**ARCHS[arch], bos_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id, dtype="bfloat16")
    torch.manual_seed(seed)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        torch.set_default_dtype(torch.bfloat16)  # a 7B model is built in bf16 directly (no fp32 copy)
        model = Qwen2ForCausalLM(config)
        torch.set_default_dtype(torch.float32)
    model.save_pretrained(str(out), safe_serialization=True)
    del model
    return out


def ensure_model(out_dir: str | Path, arch: str = "0.5b") -> Path:
    """`build_model` into out_dir unless a model is there already, in a child process: the caller (a benchmark
    that starts GPU workers itself) holds no CUDA context afterwards."""
    out = Path(out_dir)
    if not (out / "config.json").exists():
        subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(REPO / 'benchmarks')!r}); "
                        f"import bench_limits; bench_limits.build_model({str(out)!r}, arch={arch!r})"], check=True)
    return out


def model_vocab(model_dir: str | Path) -> int:
    """`ensure_model(model_dir)`, then the ids random prompts may use: the vocabulary, at most 150000 (the small
    tokenizer's special ids sit above)."""
    from transformers import AutoConfig

    ensure_model(model_dir)
    return min(150000, AutoConfig.from_pretrained(model_dir).vocab_size)


def random_prompts(n_prompts: int, prompt_len: int, seed: int = 0, low: int = 10, high: int = 150000
                   ) -> torch.Tensor:
    """(n_prompts, prompt_len) random token ids (never pad/eos of the small tokenizer)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(low, high, (n_prompts, prompt_len), generator=g)


def env_info() -> dict[str, Any]:
    """`benchmarks.harness.environment()` (commit, dirty, host, CPU, GPU, versions, CPU probe) plus the keys older
    result files carry (`device`, `device_count`, `cuda`, `rlpost_commit`)."""
    from benchmarks import harness

    info = harness.environment()
    info.update({"device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
                 "device_count": torch.cuda.device_count(), "cuda": torch.version.cuda,
                 "rlpost_commit": info["commit"]})
    return info


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn: Any) -> float:
    """Seconds of one `fn()`, the device synchronised before and after."""
    sync()
    start = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - start


def bare_engine(model_dir: Path, max_model_len: int, gpu_memory_utilization: float, enforce_eager: bool,
                **engine_kwargs: Any):
    """A vLLM engine with its defaults except length, memory share, CUDA graphs and `engine_kwargs`; sleep mode
    on."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from vllm import LLM

    start = time.perf_counter()
    llm = LLM(model=str(model_dir), dtype="bfloat16", max_model_len=max_model_len, seed=0,
              gpu_memory_utilization=gpu_memory_utilization, enforce_eager=enforce_eager,
              enable_sleep_mode=torch.cuda.is_available(), **engine_kwargs)
    return llm, time.perf_counter() - start


def _median_time(fn: Any, reps: int) -> tuple[float, list[float]]:
    """(median, all) seconds of `reps` calls of `fn`, each between two device synchronisations."""
    times = []
    for _ in range(reps):
        sync()
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2], times


def bare_generate(llm: Any, prompts: torch.Tensor, n: int, response_len: int, reps: int = 3) -> dict[str, Any]:
    """Median time of `reps` generations of len(prompts) x n samples of exactly response_len tokens
    (ignore_eos). Generation at this model size is scheduling-bound and varies from run to run."""
    from vllm import SamplingParams

    params = SamplingParams(n=n, temperature=1.0, max_tokens=response_len, ignore_eos=True, detokenize=False)
    requests = [{"prompt_token_ids": row.tolist()} for row in prompts]
    llm.generate(requests[:4], SamplingParams(n=n, max_tokens=16, ignore_eos=True, detokenize=False),
                 use_tqdm=False)  # warm-up
    counts = []

    def run() -> None:
        outs = llm.generate(requests, params, use_tqdm=False)
        counts.append(sum(len(c.token_ids) for o in outs for c in o.outputs))

    seconds, times = _median_time(run, reps)
    gen_tokens = counts[-1]
    assert set(counts) == {len(prompts) * n * response_len}, counts
    return {"s": seconds, "all_s": times, "gen_tokens": gen_tokens, "gen_tokens_per_s": gen_tokens / seconds}


def weights_on_gpu(model_dir: Path) -> dict[str, torch.Tensor]:
    """The saved model's tensors (HF names) loaded onto the GPU, as the actor would send them."""
    from safetensors.torch import load_file

    return {k: v for f in sorted(model_dir.glob("*.safetensors")) for k, v in load_file(str(f), device="cuda").items()}


def load_in_place(llm: Any, weights: dict[str, torch.Tensor]) -> None:
    """The engine model's plain `load_weights` of `weights` (HF names), into its live parameters."""

    def _load(worker: Any) -> None:
        with torch.no_grad():
            worker.model_runner.model.load_weights(iter(weights.items()))

    llm.collective_rpc(_load)


def bare_reload(llm: Any, weights: dict[str, torch.Tensor], reps: int = 5) -> dict[str, Any]:
    """vLLM's own in-place `reload_weights` of `weights` (GPU tensors, HF names), the model's plain
    `load_weights` of the same tensors, and the weights-only wake-up after a level-2 sleep (medians)."""

    def _reload(worker: Any) -> None:
        worker.model_runner.reload_weights(weights_iterator=iter(weights.items()))

    med, times = _median_time(lambda: llm.collective_rpc(_reload), reps)
    load_s, load_all = _median_time(lambda: load_in_place(llm, weights), reps)
    wakes = []
    for _ in range(reps):
        llm.sleep(level=2)
        sync()
        start = time.perf_counter()
        llm.wake_up(tags=["weights"])
        sync()
        wakes.append(time.perf_counter() - start)
        load_in_place(llm, weights)
        llm.wake_up(tags=["kv_cache"])
    nbytes = sum(t.numel() * t.element_size() for t in weights.values())
    return {"s": med, "all_s": times, "bytes": nbytes, "GB_per_s": nbytes / med / 1e9,
            "load_s": load_s, "load_all_s": load_all, "wake_weights_s": sorted(wakes)[len(wakes) // 2],
            "wake_weights_all_s": wakes}


def bare_sleep_wake(llm: Any) -> dict[str, float]:
    """Time `sleep(level=1)` and `wake_up()`; bytes of device memory freed by sleep."""
    free0, _ = torch.cuda.mem_get_info()
    start = time.perf_counter()
    llm.sleep(level=1)
    sleep_s = time.perf_counter() - start
    free1, _ = torch.cuda.mem_get_info()
    start = time.perf_counter()
    llm.wake_up()
    wake_s = time.perf_counter() - start
    return {"sleep_s": sleep_s, "wake_s": wake_s, "freed_GB": (free1 - free0) / 1e9}


def response_log_probs(model: Any, ids: torch.Tensor, prompt_len: int) -> torch.Tensor:
    """(b, R) float32 log-probs of ids[:, P:] under `model` (causal SDPA, no padding mask)."""
    hidden = model.model(input_ids=ids, use_cache=False).last_hidden_state[:, prompt_len - 1:-1]
    logits = model.lm_head(hidden).float()
    return torch.log_softmax(logits, dim=-1).gather(-1, ids[:, prompt_len:, None]).squeeze(-1)


@torch.no_grad()
def forward_pass(model: Any, ids: torch.Tensor, prompt_len: int, micro: int) -> None:
    """Response log-probs of all rows of `ids` (B, P+R) in micro-batches of `micro` rows (untimed)."""
    model.eval()
    for i in range(0, len(ids), micro):
        response_log_probs(model, ids[i:i + micro].to(model.device, non_blocking=True), prompt_len)


def train_pass(model: Any, opt: Any, adv: torch.Tensor, ids: torch.Tensor, prompt_len: int, micro: int,
               mini: int) -> None:
    """fwd + bwd of a policy-gradient-shaped loss per micro-batch, clipped `opt` step per mini-batch of `mini`
    rows, over all rows of `ids` (untimed)."""
    model.train()
    for lo in range(0, len(ids), mini):
        hi = min(lo + mini, len(ids))
        for i in range(lo, hi, micro):
            logp = response_log_probs(model, ids[i:i + micro].to(model.device, non_blocking=True), prompt_len)
            (-(logp * adv[i:i + micro, None]).mean() * micro / (hi - lo)).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)


def adamw(model: Any) -> Any:
    """The bare loops' optimizer: AdamW, fused on a GPU."""
    return torch.optim.AdamW(model.parameters(), lr=1e-6, fused=model.device.type == "cuda")


def bare_forward(model: Any, ids: torch.Tensor, prompt_len: int, micro: int) -> dict[str, float]:
    """`forward_pass` over all rows after a one-micro-batch warm-up, timed."""
    forward_pass(model, ids[:micro], prompt_len, micro)
    seconds = timed(lambda: forward_pass(model, ids, prompt_len, micro))
    return {"s": seconds, "tokens": ids.numel(), "tokens_per_s": ids.numel() / seconds}


def bare_train(model: Any, ids: torch.Tensor, prompt_len: int, micro: int, mini: int) -> dict[str, float]:
    """`train_pass` over all rows after a one-micro-batch step (allocates the optimizer state), timed."""
    opt = adamw(model)
    adv = torch.randn(len(ids), device=model.device)
    train_pass(model, opt, adv, ids[:micro], prompt_len, micro, micro)
    seconds = timed(lambda: train_pass(model, opt, adv, ids, prompt_len, micro, mini))
    return {"s": seconds, "tokens": ids.numel(), "tokens_per_s": ids.numel() / seconds}


def measure(args: argparse.Namespace, model_dir: Path) -> dict[str, Any]:
    """All limits for each prompt count in args.prompts; engine first, then (engine asleep) training."""
    from transformers import AutoModelForCausalLM

    res: dict[str, Any] = {"env": env_info(), "model": {"arch": f"Qwen2.5-{args.arch.upper()} (random weights)",
                                                        **ARCHS[args.arch]},
                           "args": vars(args).copy(), "per_batch": {}}
    res["args"].pop("json_out", None)
    max_len = args.prompt_len + args.response_len
    llm, res["engine_start_s"] = bare_engine(model_dir, max_len, args.gpu_memory_utilization, args.enforce_eager)
    for n_prompts in args.prompts:
        prompts = random_prompts(n_prompts, args.prompt_len, seed=n_prompts)
        res["per_batch"][str(n_prompts)] = {"gen": bare_generate(llm, prompts, args.n, args.response_len,
                                                                args.gen_reps)}
        print(f"[limits] gen {n_prompts}x{args.n}: {res['per_batch'][str(n_prompts)]['gen']}", flush=True)
    weights = weights_on_gpu(model_dir)
    res["reload"] = bare_reload(llm, weights)
    del weights
    res["sleep_wake"] = bare_sleep_wake(llm)
    llm.sleep(level=1)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.bfloat16,
                                                 attn_implementation="sdpa").cuda()
    if args.grad_ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    for n_prompts in args.prompts:
        rows = n_prompts * args.n
        ids = torch.randint(10, 150000, (rows, max_len), generator=torch.Generator().manual_seed(rows))
        ids = ids.pin_memory()
        entry = res["per_batch"][str(n_prompts)]
        entry["fwd"] = bare_forward(model, ids, args.prompt_len, args.fwd_micro)
        entry["train"] = bare_train(model, ids, args.prompt_len, args.train_micro, args.mini_prompts * args.n)
        entry["sum_limits_s"] = (entry["gen"]["s"] + 2 * entry["fwd"]["s"] + entry["train"]["s"]
                                 + res["reload"]["s"])
        print(f"[limits] {n_prompts}x{args.n}: fwd {entry['fwd']['s']:.2f}s train {entry['train']['s']:.2f}s",
              flush=True)
    res["peak_mem_GB"] = torch.cuda.max_memory_allocated() / 1e9
    return res


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--response-len", type=int, default=512)
    ap.add_argument("--fwd-micro", type=int, default=32, help="rows per forward micro-batch")
    ap.add_argument("--train-micro", type=int, default=32, help="rows per training micro-batch")
    ap.add_argument("--gen-reps", type=int, default=3, help="generations per batch (the median counts)")
    ap.add_argument("--mini-prompts", type=int, default=64, help="prompts per optimizer step")
    ap.add_argument("--grad-ckpt", type=int, default=1, help="gradient checkpointing in the train loop")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    ap.add_argument("--enforce-eager", action="store_true")
    ap.add_argument("--arch", choices=sorted(ARCHS), default="0.5b",
                    help="the random-weight model's architecture (7b: run one GPU's share of a multi-GPU batch)")
    ap.add_argument("--model-dir", type=Path, default=None, help="reuse a model built by build_model")
    ap.add_argument("--save-model", type=Path, default=None, metavar="DIR",
                    help="only save the random-weight model + tokenizer into DIR and exit")
    ap.add_argument("--json-out", type=Path, default=None)
    return ap.parse_args(argv)


def check_arch(model_dir: Path, arch: str) -> None:
    """Stop when the model in `model_dir` is not of `arch` (the results name the architecture given)."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    wrong = {k: (config.get(k), ARCHS[arch][k]) for k in ("hidden_size", "num_hidden_layers", "intermediate_size")
             if config.get(k) != ARCHS[arch][k]}
    if wrong:
        raise SystemExit(f"bench_limits: {model_dir} is not the {arch} architecture ({wrong}: found, expected); "
                         f"pass the matching --arch or another --model-dir")


def main() -> None:
    args = parse_args()
    if args.save_model is not None:
        print(f"[limits] model saved to {build_model(args.save_model, arch=args.arch)}")
        return
    if args.model_dir is not None:
        check_arch(args.model_dir, args.arch)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = args.model_dir or build_model(Path(tmp) / f"qwen_{args.arch}_random", arch=args.arch)
        res = measure(args, model_dir)
    print(f"[limits] wrote {build_result(args, res).write(path=args.json_out)}")


def build_result(args: argparse.Namespace, res: dict[str, Any]) -> Any:
    """The harness result of `measure`'s output: per batch size, the median seconds of generation, forward and
    training (and their sum with the reload) as metrics with every repetition; the rest kept as it was."""
    from benchmarks import harness

    name = "limits" if args.arch == "0.5b" else f"limits_{args.arch}"
    res = dict(res)
    result = harness.Result(name, harness.command_line(), args.gen_reps, env=res.pop("env"))
    for n_prompts, entry in res["per_batch"].items():
        for phase in ("gen", "fwd", "train"):
            if phase in entry:
                result.metric(f"{phase}_s_{n_prompts}x{args.n}", entry[phase]["s"], unit="s",
                              values=entry[phase].get("all_s", []))
        if "sum_limits_s" in entry:
            result.metric(f"sum_limits_s_{n_prompts}x{args.n}", entry["sum_limits_s"], unit="s")
    result.extra.update({**res, "args": harness.params(args)})
    return result


if __name__ == "__main__":
    main()
