"""PPO's critic phases against strong bare value-head loops, paired rounds: `values` and `update_critic`.

    python -m benchmarks.bench_critic --model-dir /tmp/m_0.5b --prompts 64 --n 8 --rounds 5   # GPU host

The value model is what rlpost's critic loads: `AutoModelForTokenClassification` with one label on the model's
backbone. It is saved once with its head (`<model-dir>_value`), so both sides start from the same weights and
their values can be compared before any update. The bare side: that model in bf16 with fused AdamW (no fp32
master copy), the GSM8K-shaped batch (`benchmarks.workload`) packed first-fit into rows of at most
`--fwd-tokens` / `--train-tokens` tokens (`strong_limits.pack`, packed attention), the value head applied only
at the positions that score a response token; `values` is one no-grad pass, `update_critic` the clipped value
loss over the whole batch (gradient accumulation over the rows, clipped gradients, one optimiser step). The
rlpost side: its own `CriticWorker` (FSDP2, `critic.model.use_remove_padding=true`, dynamic micro-batches of the
same token budgets, one mini-batch, one epoch) called in this process, `compute_values` then `update_critic` on
the same rows. Rounds alternate the order (`harness.alternate`). Goals: E1 (values, bare / rlpost >= 0.90) and
E1_update (update_critic, >= 0.95); both sides' MFU (2·N·tokens and 6·N·tokens over 989 TFLOP/s) beside them.
`--profile 1` (GPU) ends with a torch.profiler pass over each side's update. `--fp32-master 1` adds a third
side, the bare loop with rlpost's precision (fp32 parameters and AdamW state, bf16
autocast): `update_bare_fp32_over_rlpost` then splits E1_update's gap into what the precision costs and the rest.
Writes `benchmarks/results/<date>_<gpu>/critic.json` (`--session` for another folder).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch

from benchmarks import harness

REPO = Path(__file__).resolve().parents[1]
sys.path.append(str(REPO / "benchmarks"))

PEAK = 989e12  # H100/H200 dense bf16, the MFU denominator
TARGETS = {"E1": ">= 0.90", "E1_update": ">= 0.95"}
CLIP = 0.5  # critic.cliprange_value's default, used by both sides


def value_model_dir(model_dir: Path) -> Path:
    """`<model_dir>_value`: the model as a one-label token classifier with its (seeded) head, and the tokenizer."""
    from transformers import AutoConfig, AutoModelForTokenClassification, AutoTokenizer

    out = Path(f"{model_dir}_value")
    if (out / "config.json").exists():
        return out
    cfg = AutoConfig.from_pretrained(model_dir)
    cfg.num_labels, cfg.classifier_dropout = 1, 0.0
    torch.manual_seed(0)
    model = AutoModelForTokenClassification.from_pretrained(model_dir, config=cfg, dtype=torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    AutoTokenizer.from_pretrained(model_dir).save_pretrained(out)
    return out


def sequences(args: argparse.Namespace) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, response ids) of every sample: the workload's prompts and caps, seeded random responses."""
    from benchmarks import workload

    wl = workload.gsm8k_shaped(args.prompts, args.n, args.cap, args.seed)
    prompts = workload.token_prompts(wl, args.vocab, args.seed)
    g = torch.Generator().manual_seed(args.seed + 1)
    return [(prompts[i // args.n], torch.randint(10, args.vocab, (r,), generator=g).tolist())
            for i, (_, r) in enumerate(wl.rows())]


def clipped_value_loss_sum(v: torch.Tensor, old: torch.Tensor, ret: torch.Tensor, clip: float) -> torch.Tensor:
    """Sum over tokens of PPO's clipped value loss 0.5·max((v-R)², (old + clamp(v-old, ±clip) - R)²); (k,) in."""
    clipped = old + (v - old).clamp(-clip, clip)
    return 0.5 * torch.maximum((v - ret) ** 2, (clipped - ret) ** 2).sum()


class ValueLimits:
    """The bare value-head loops over one packed batch; `values()` / `update()` return seconds."""

    def __init__(self, value_dir: Path, seqs: list[tuple[list[int], list[int]]], fwd_tokens: int,
                 train_tokens: int, grad_ckpt: bool, device: str, fp32_master: bool = False) -> None:
        from transformers import AutoModelForTokenClassification

        from benchmarks.strong_limits import pack
        from rlpost.engine.packed_attention import use_packed_attention

        self.device, self.fp32_master = device, fp32_master
        dtype = torch.float32 if fp32_master else torch.bfloat16  # fp32: parameters and AdamW state, bf16 autocast
        self.model = AutoModelForTokenClassification.from_pretrained(str(value_dir), dtype=dtype).to(device)
        use_packed_attention(self.model)
        if grad_ckpt:
            self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-7, fused=device == "cuda")
        self.params = sum(p.numel() for p in self.model.parameters())
        self.tokens = sum(len(p) + len(r) for p, r in seqs)
        self.fwd_rows, self.train_rows = pack(seqs, fwd_tokens, device), pack(seqs, train_tokens, device)
        g = torch.Generator().manual_seed(2)
        self.old = [torch.randn(r.where.numel(), generator=g).to(device) for r in self.train_rows]
        self.ret = [torch.randn(r.where.numel(), generator=g).to(device) for r in self.train_rows]
        self.applied = {"dtype": "float32 + bf16 autocast" if fp32_master else "bfloat16", "attention": "packed",
                        "grad_ckpt": grad_ckpt, "head": "scored only",
                        "optimizer": "AdamW fused" if device == "cuda" else "AdamW"}

    def row_values(self, row: Any) -> torch.Tensor:
        """(k,) float32 values at the row's scored positions (the head on those positions only)."""
        with torch.autocast(self.device, dtype=torch.bfloat16, enabled=self.fp32_master):
            hidden = self.model.model(input_ids=row.ids, position_ids=row.positions,
                                      use_cache=False).last_hidden_state
            return self.model.score(hidden[0, row.where])[:, 0].float()

    def _sync(self) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()

    @torch.no_grad()
    def _values_pass(self) -> list[torch.Tensor]:
        self.model.eval()
        return [self.row_values(row) for row in self.fwd_rows]

    def _update_pass(self) -> None:
        """The clipped value loss, token mean over the batch (accumulated row by row), clipped grads, one step."""
        self.model.train()
        total = sum(int(r.where.numel()) for r in self.train_rows)
        for row, old, ret in zip(self.train_rows, self.old, self.ret):
            (clipped_value_loss_sum(self.row_values(row), old, ret, CLIP) / total).backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def values(self) -> float:
        return harness.timed(self._values_pass, self._sync)[0]

    def update(self) -> float:
        return harness.timed(self._update_pass, self._sync)[0]


def critic_worker(value_dir: Path, model_dir: Path, args: argparse.Namespace, device: str) -> Any:
    """rlpost's `CriticWorker` in this process (rank 0 of 1) from the package's `ppo_trainer` config (GAE)."""
    from hydra import compose, initialize_config_module

    from rlpost.utils.distributed import free_port
    from rlpost.workers.fsdp_workers import CriticWorker

    over = ["algorithm.adv_estimator=gae", f"actor_rollout_ref.model.path={model_dir}",
            f"actor_rollout_ref.rollout.n={args.n}", f"data.max_prompt_length={args.prompt_len}",
            f"data.max_response_length={args.cap}", f"data.train_batch_size={args.prompts}",
            f"critic.model.path={value_dir}", f"critic.model.tokenizer_path={model_dir}",
            "critic.model.use_remove_padding=true",
            f"critic.model.enable_gradient_checkpointing={str(bool(args.grad_ckpt)).lower()}",
            "critic.use_dynamic_bsz=true", f"critic.ppo_max_token_len_per_gpu={args.train_tokens}",
            f"critic.forward_max_token_len_per_gpu={args.fwd_tokens}", f"critic.ppo_mini_batch_size={args.prompts}",
            "critic.ppo_epochs=1", "critic.shuffle=false", f"critic.cliprange_value={CLIP}",
            "trainer.n_gpus_per_node=1", *args.override]
    with initialize_config_module(config_module="rlpost.trainer.config", version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=over)
    for key, val in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                     "MASTER_PORT": str(free_port()), "RLPOST_DEVICE": device}.items():
        os.environ.setdefault(key, val)
    worker = CriticWorker(cfg.critic)
    worker.init_model(total_training_steps=1000)
    return worker


def critic_batch(seqs: list[tuple[list[int], list[int]]], prompt_len: int, cap: int) -> Any:
    """The trainer's critic input: prompts left-padded to `prompt_len`, responses right-padded to `cap`, with
    seeded old values and returns."""
    from rlpost import keys
    from rlpost.protocol import DataProto

    b = len(seqs)
    ids = torch.zeros(b, prompt_len + cap, dtype=torch.long)
    attn = torch.zeros_like(ids)
    for i, (prompt, response) in enumerate(seqs):
        ids[i, prompt_len - len(prompt):prompt_len + len(response)] = torch.tensor(prompt + response)
        attn[i, prompt_len - len(prompt):prompt_len + len(response)] = 1
    g = torch.Generator().manual_seed(2)
    r_mask = attn[:, prompt_len:]
    return DataProto.from_dict(tensors={
        keys.INPUT_IDS: ids, keys.ATTENTION_MASK: attn, keys.POSITION_IDS: (attn.cumsum(-1) - 1).clamp(min=0),
        keys.RESPONSES: ids[:, prompt_len:], keys.RESPONSE_MASK: r_mask,
        keys.VALUES: torch.randn(b, cap, generator=g) * r_mask,
        keys.RETURNS: torch.randn(b, cap, generator=g) * r_mask})


def values_gap(bare: ValueLimits, worker: Any, batch: Any, seqs: list[tuple[list[int], list[int]]],
               rows: int = 8) -> float:
    """Largest |bare - rlpost| value over the response tokens of the first `rows` samples (each run alone on
    the bare side) over the largest |value| there, before either side updates (same weights)."""
    from benchmarks.strong_limits import pack
    from rlpost import keys

    ours = worker.compute_values(batch).batch[keys.VALUES]
    worst, scale = 0.0, 0.0
    with torch.no_grad():
        bare.model.eval()
        for i, (prompt, response) in enumerate(seqs[:rows]):
            mine = bare.row_values(pack([(prompt, response)], 10 ** 9, bare.device)[0]).cpu()
            worst = max(worst, float((mine - ours[i, :len(response)]).abs().max()))
            scale = max(scale, float(mine.abs().max()))
    return worst / max(scale, 1e-6)


def summarize(res: harness.Result, rounds: list[dict[str, Any]], params: int, tokens: int) -> None:
    """Per-round ratios bare / rlpost (goals E1, E1_update), both sides' MFU and seconds into `res`; with a
    `bare_fp32` side, its update over rlpost's as a metric (not a goal)."""
    bare, ours = [r["bare"] for r in rounds], [r["rlpost"] for r in rounds]
    if all("bare_fp32" in r for r in rounds):
        stats = harness.paired_ratio([r["bare_fp32"]["update_s"] for r in rounds], [o["update_s"] for o in ours])
        res.metric("update_bare_fp32_over_rlpost", **{k: stats[k] for k in ("value", "ci_low", "ci_high", "values")},
                   unit="bare fp32-master / rlpost")
        res.timing("bare_fp32_update_s", [r["bare_fp32"]["update_s"] for r in rounds])
    res.reps = len(rounds)  # a run cut short counts the rounds it finished
    for gid, key in (("E1", "values_s"), ("E1_update", "update_s")):
        stats = harness.paired_ratio([b[key] for b in bare], [o[key] for o in ours])
        res.metric(f"{key[:-2]}_bare_over_rlpost", **{k: stats[k] for k in ("value", "ci_low", "ci_high", "values")},
                   unit="bare/rlpost")
        res.goal(gid, stats, TARGETS[gid])
    for side, rows in (("bare", bare), ("rlpost", ours)):
        for key, k in (("values_s", 2), ("update_s", 6)):
            res.timing(f"{side}_{key}", [r[key] for r in rows])
            stats = harness.geomean_ci([k * params * tokens / r[key] / PEAK for r in rows])
            res.metric(f"{side}_{key[:-2]}_mfu", **{x: stats[x] for x in ("value", "ci_low", "ci_high", "values")},
                       unit="fraction")


def run(args: argparse.Namespace) -> harness.Result:
    """Both sides built, one untimed warm-up each (the values compared there), then `args.rounds` paired rounds."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    value_dir = value_model_dir(args.model_dir)
    seqs = sequences(args)
    bare = ValueLimits(value_dir, seqs, args.fwd_tokens, args.train_tokens, bool(args.grad_ckpt), device)
    worker = critic_worker(value_dir, args.model_dir, args, device)
    batch = critic_batch(seqs, args.prompt_len, args.cap)
    gap = values_gap(bare, worker, batch, seqs)
    assert gap < args.max_value_gap, f"bare and rlpost values differ by {gap:.3g} of their scale before any update"
    sync = bare._sync

    def rlpost_round() -> dict[str, float]:
        v_s, out = harness.timed(lambda: worker.compute_values(batch), sync)
        u_s, _ = harness.timed(lambda: worker.update_critic(batch), sync)
        assert out.batch["values"].shape == batch.batch["responses"].shape
        return {"s": v_s + u_s, "values_s": v_s, "update_s": u_s}

    def bare_round(side: ValueLimits = bare) -> dict[str, float]:
        v_s, u_s = side.values(), side.update()
        return {"s": v_s + u_s, "values_s": v_s, "update_s": u_s}

    sides: dict[str, Any] = {"bare": bare_round, "rlpost": rlpost_round}
    if args.fp32_master:
        bare32 = ValueLimits(value_dir, seqs, args.fwd_tokens, args.train_tokens, bool(args.grad_ckpt), device,
                             fp32_master=True)
        sides["bare_fp32"] = lambda: bare_round(bare32)
    for side in sides.values():  # warm-up: allocator, optimiser state, kernels
        side()
    res = harness.Result("critic", harness.command_line(), args.rounds)
    res.metric("values_gap_before_update", gap, unit="max |bare - rlpost| / max |value|")
    res.extra.update(args=harness.params(args), bare_applied=bare.applied, params=bare.params, tokens=bare.tokens,
                     scored_tokens=sum(len(r) for _, r in seqs), samples=len(seqs), value_model=str(value_dir))

    def on_round(row: dict[str, Any]) -> None:
        b, o = row["bare"], row["rlpost"]
        fp32 = f" | bare fp32-master update {row['bare_fp32']['update_s']:.3f}s" if "bare_fp32" in row else ""
        print(f"[critic] round {row['round']} {row['order']}: bare values {b['values_s']:.3f}s update "
              f"{b['update_s']:.3f}s | rlpost values {o['values_s']:.3f}s update {o['update_s']:.3f}s{fp32}",
              flush=True)
        res.extra.setdefault("rounds", []).append(row)
        if len(res.extra["rounds"]) >= 2:  # a run cut short keeps what it measured
            summarize(res, res.extra["rounds"], bare.params, bare.tokens)
            res.write(session=args.session)

    harness.alternate(sides, args.rounds, on_round=on_round)
    if args.profile and device == "cuda":  # last: CUPTI can slow what runs after it
        from bench_update_profile import profile_call

        res.extra["profile"] = {"rlpost_update_critic": profile_call(lambda: worker.update_critic(batch),
                                                                     "profile rlpost update_critic"),
                                "bare_update": profile_call(bare._update_pass, "profile bare update")}
        res.write(session=args.session)
    return res


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from benchmarks import strong_limits

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    strong_limits.add_paired_arguments(ap, rounds=5, worker="critic")
    ap.add_argument("--max-value-gap", type=float, default=0.3,
                    help="largest |bare - rlpost| value over the largest |value| allowed before any update (the "
                         "same weights; bf16 kernels and batching apart, a wrong position reads as ~1 or more)")
    ap.add_argument("--profile", type=int, default=1,
                    help="1 (GPU only): after the rounds, a torch.profiler pass over one rlpost update_critic and one "
                         "bare update (top ops by device time and by count, device busy vs wall), kept under "
                         "`profile` in critic.json")
    ap.add_argument("--fp32-master", type=int, default=1,
                    help="1: also time the bare loop with fp32 parameters and AdamW state under bf16 autocast "
                         "(rlpost's precision), to split E1_update's gap; 0: the two sides only")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> harness.Result:
    import bench_limits

    args = parse_args(argv)
    args.vocab = bench_limits.model_vocab(args.model_dir)
    res = run(args)
    if len(res.extra.get("rounds", [])) < 2:
        raise SystemExit(f"[critic] --rounds {args.rounds}: needs at least 2 rounds for an interval")
    print("[critic] " + json.dumps(res.goals), flush=True)
    print(f"[critic] wrote {res.write(session=args.session)}", flush=True)
    return res


if __name__ == "__main__":
    main()
