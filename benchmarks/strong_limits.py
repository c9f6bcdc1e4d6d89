"""Strong bare loops for the log-prob pass and the actor update: what one GPU does with no framework around it.

    python -m benchmarks.strong_limits --model-dir /tmp/m --prompts 64 --n 8 --reps 5    # GPU host, workload

As good as one writes them quickly: bf16 parameters with fused AdamW (no fp32 master copy), sequences packed
into rows of at most `--fwd-tokens` / `--train-tokens` tokens with no padding (attention within each sequence:
PyTorch's varlen flash kernel through `rlpost.engine.packed_attention`), the LM head fused with the log-softmax
and gather so no (tokens x vocab) logits are kept (`rlpost.engine.fused_logprob`, its per-chunk maths under
torch.compile), and Liger's RMSNorm / RoPE / SwiGLU kernels where `liger_kernel` is installed on a GPU. The
update is one optimiser step over the whole batch (gradient accumulation over the packed rows, clipped), the
policy-gradient loss of the response tokens; the log-prob pass also computes the entropy, as old_log_prob does.
Gradient checkpointing follows `--grad-ckpt` (set it as the run it bounds does).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from benchmarks import harness


@dataclass
class PackedRow:
    """One packed micro-batch: ids/positions (1, T), `where` (k,) the positions whose next token is scored,
    `labels` (k,) those tokens."""

    ids: torch.Tensor
    positions: torch.Tensor
    where: torch.Tensor
    labels: torch.Tensor


def pack(sequences: list[tuple[list[int], list[int]]], max_tokens: int, device: str) -> list[PackedRow]:
    """Greedy first-fit of (prompt ids, response ids) pairs into rows of at most `max_tokens` tokens (a longer
    sequence gets a row of its own); each response token is scored from the position before it."""
    rows: list[list[tuple[list[int], list[int]]]] = []
    sizes: list[int] = []
    for seq in sorted(sequences, key=lambda s: -(len(s[0]) + len(s[1]))):
        n = len(seq[0]) + len(seq[1])
        slot = next((i for i, s in enumerate(sizes) if s + n <= max_tokens), None)
        if slot is None:
            rows.append([seq])
            sizes.append(n)
        else:
            rows[slot].append(seq)
            sizes[slot] += n
    out = []
    for row in rows:
        ids, pos, where = [], [], []
        for prompt, response in row:
            start = len(ids)
            ids += prompt + response
            pos += list(range(len(prompt) + len(response)))
            where += range(start + len(prompt) - 1, start + len(prompt) + len(response) - 1)
        t_ids = torch.tensor(ids, device=device)[None]
        t_where = torch.tensor(where, device=device)
        out.append(PackedRow(t_ids, torch.tensor(pos, device=device)[None], t_where, t_ids[0, t_where + 1]))
    return out


def load_model(model_dir: Path, device: str, grad_ckpt: bool, liger: bool | None = None) -> tuple[Any, dict]:
    """The model in bf16 with packed attention (and Liger when `liger` is True, or None and it is installed on
    a GPU); returns (model, what was applied)."""
    from transformers import AutoModelForCausalLM

    from rlpost.engine.packed_attention import use_packed_attention

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.bfloat16).to(device)
    if liger is None:
        try:
            import liger_kernel  # noqa: F401
            liger = device == "cuda"
        except ImportError:
            liger = False
    if liger:
        from rlpost.engine.liger import apply_liger

        apply_liger(model)
    use_packed_attention(model)
    if grad_ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model, {"liger": bool(liger), "grad_ckpt": grad_ckpt, "dtype": "bfloat16", "attention": "packed"}


def _head_opts(with_entropy: bool, device: str) -> Any:
    from rlpost.engine.fused_logprob import FusedHeadOptions, compiled, eager

    return FusedHeadOptions(temperature=1.0, with_entropy=with_entropy, chunk=8192,
                            compile_fn=compiled if device == "cuda" else eager)


def row_log_probs(model: Any, row: PackedRow, opts: Any) -> torch.Tensor:
    """(k, 2) float32 [log-prob, entropy] of the row's scored tokens."""
    from rlpost.engine.fused_logprob import fused_logprob

    hidden = model.model(input_ids=row.ids, position_ids=row.positions, use_cache=False).last_hidden_state[0]
    return fused_logprob(hidden[row.where], model.get_output_embeddings().weight, row.labels, opts)


@torch.no_grad()
def forward_pass(model: Any, rows: list[PackedRow], opts: Any = None) -> int:
    """Log-probs and entropies of every scored token (`opts`: the head's options, default `_head_opts`); returns
    their count."""
    model.eval()
    opts = opts or _head_opts(True, rows[0].ids.device.type)
    return sum(int(row_log_probs(model, row, opts).shape[0]) for row in rows)


def train_pass(model: Any, opt: Any, rows: list[PackedRow], adv: list[torch.Tensor], opts: Any = None) -> None:
    """fwd + bwd of -mean(logp * adv) over all scored tokens (accumulated row by row), clip, one step."""
    model.train()
    opts = opts or _head_opts(False, rows[0].ids.device.type)
    total = sum(int(r.where.numel()) for r in rows)
    for row, a in zip(rows, adv):
        logp = row_log_probs(model, row, opts)[:, 0]
        (-(logp * a).sum() / total).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)


class StrongLimits:
    """The model, its optimiser and the packed rows of one batch; `fwd()` / `train()` return seconds."""

    def __init__(self, model_dir: Path, sequences: list[tuple[list[int], list[int]]], fwd_tokens: int,
                 train_tokens: int, grad_ckpt: bool, device: str, liger: bool | None = None) -> None:
        self.device = device
        self.model, self.applied = load_model(model_dir, device, grad_ckpt, liger)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-7, fused=device == "cuda")
        self.tokens = sum(len(p) + len(r) for p, r in sequences)
        self.params = sum(p.numel() for p in self.model.parameters())
        self.set_batch(sequences, fwd_tokens, train_tokens)

    def set_batch(self, sequences: list[tuple[list[int], list[int]]], fwd_tokens: int, train_tokens: int) -> None:
        self.fwd_rows = pack(sequences, fwd_tokens, self.device)
        self.train_rows = pack(sequences, train_tokens, self.device)
        g = torch.Generator().manual_seed(0)
        self.adv = [torch.randn(r.where.numel(), generator=g).to(self.device) for r in self.train_rows]
        self.tokens = sum(len(p) + len(r) for p, r in sequences)

    def _sync(self) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()

    def fwd(self) -> float:
        return harness.timed(lambda: forward_pass(self.model, self.fwd_rows), self._sync)[0]

    def train(self) -> float:
        return harness.timed(lambda: train_pass(self.model, self.opt, self.train_rows, self.adv), self._sync)[0]

    def warm_up(self) -> None:
        """One untimed pass of each (compilation, allocator, optimiser state)."""
        self.fwd()
        self.train()


def add_arguments(ap: argparse.ArgumentParser, prompt_len: bool = True) -> None:
    """The strong loops' knobs, shared by the drivers that run them beside rlpost: packing budgets, checkpointing
    (and the padded prompt length rlpost's batch uses)."""
    if prompt_len:
        ap.add_argument("--prompt-len", type=int, default=192, help="data.max_prompt_length (>= the longest prompt)")
    ap.add_argument("--fwd-tokens", type=int, default=32768, help="token budget of a forward micro-batch")
    ap.add_argument("--train-tokens", type=int, default=16384, help="token budget of an update micro-batch")
    ap.add_argument("--grad-ckpt", type=int, default=1)


def add_paired_arguments(ap: argparse.ArgumentParser, rounds: int, worker: str) -> None:
    """A paired-rounds driver's arguments: the workload, the strong loops' knobs, rounds, rlpost `worker`'s extra
    overrides and the result folder."""
    from benchmarks import workload

    workload.add_arguments(ap)  # a missing model folder is built (0.5B architecture)
    add_arguments(ap)
    ap.add_argument("--rounds", type=int, default=rounds)
    ap.add_argument("--override", nargs="*", default=[], help=f"extra Hydra overrides of the rlpost {worker}")
    ap.add_argument("--session", type=Path, default=None, help="result folder (default: by date and GPU)")


def mfu(flops_per_token_param: int, params: int, tokens: int, seconds: float, peak: float = 989e12) -> float:
    """Model FLOPs utilisation: `flops_per_token_param` x N x tokens / seconds / peak (6 update, 2 forward)."""
    return flops_per_token_param * params * tokens / seconds / peak


def main(argv: list[str] | None = None) -> None:
    from benchmarks import workload

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    workload.add_arguments(ap)
    ap.add_argument("--reps", type=int, default=5)
    add_arguments(ap, prompt_len=False)
    args = ap.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    wl = workload.gsm8k_shaped(args.prompts, args.n, args.cap, args.seed)
    prompts = workload.token_prompts(wl, vocab=1000)
    g = torch.Generator().manual_seed(1)
    seqs = [(prompts[i // args.n], torch.randint(10, 1000, (r,), generator=g).tolist())
            for i, (_, r) in enumerate(wl.rows())]
    lim = StrongLimits(args.model_dir, seqs, args.fwd_tokens, args.train_tokens, bool(args.grad_ckpt), device)
    lim.warm_up()
    res = harness.Result("strong_limits", harness.command_line(), args.reps)
    for name, fn, k in (("fwd", lim.fwd, 2), ("train", lim.train, 6)):
        times = [fn() for _ in range(args.reps)]
        s = harness.spread(times)
        res.metric(f"{name}_s", s["median"], s["min"], s["max"], "s", times)
        res.metric(f"{name}_mfu", mfu(k, lim.params, lim.tokens, s["median"]), unit="fraction")
    res.extra["applied"] = lim.applied
    res.extra["tokens"] = lim.tokens
    print(f"[strong_limits] {res.metrics} -> {res.write()}")


if __name__ == "__main__":
    main()
