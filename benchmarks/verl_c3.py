"""Goal C3 (issue 48): rlpost's step time against verl's at verl's recommended settings, one GPU, the same data.

    python3 -m benchmarks.verl_c3 rlpost --model-dir /tmp/m_0.5b --data /tmp/c3_data --session S   # rlpost's run
    python3 -m benchmarks.verl_side run --wheels carry/verl_side --model-dir /tmp/m_0.5b --data /tmp/c3_data \
        --session S                                                                                  # verl's run
    python3 -m benchmarks.verl_c3 summary --model-dir /tmp/m_0.5b --data /tmp/c3_data --session S  # verl_c3.json
    bash benchmarks/gpu_session_c3.sh [--dry-run]                                                    # all of it

The work: both trainers read the same parquet (`benchmarks/workload.py`: 64 prompts x 8 a step, long-tailed
prompt lengths and per-sample response caps, file order, no shuffle), with `rollout.ignore_eos=true`. rlpost stops
each sample at its cap (`extra_info.response_caps`); verl does through `benchmarks/verl_caps/sitecustomize.py`.
So every sample of step k has the same prompt and response tokens on both sides. `summary` checks it from both
runs' logs: each step's `response_length/mean` and `prompt_length/mean` against the file's own counts (verl:
within 0.1 %; rlpost within 1 %, because it masks a response after a sampled EOS token, which a random model
draws now and then, where verl keeps the tokens).

rlpost runs its GPU example (`examples/grpo_trainer/run_qwen2_5_0_5b_gpu.sh`) as it is, with the workload's
lengths and batch; verl runs `verl_side.verl_command` (run_qwen2-7b_seq_balance.sh scaled to one GPU, padded with
dynamic batch size and SDPA: its packing needs flash-attn, absent on the host).

C3 = median rlpost step / median verl step over steps 2..N. The steps are not paired (two runs, one after the
other), so the interval is the range of all cross-step ratios (min rlpost / max verl .. max rlpost / min verl),
not a confidence interval.

MFU by verl 0.9.1's own formula (`verl.utils.flops_counter`, Qwen2): FLOPs = 6 x dense_N x tokens + 6 x sum(seqlen^2)
x head_dim x heads x layers, dense_N = layers x (3 x hidden x intermediate + hidden x (q + k + v + o widths))
+ 2 x vocab x hidden (embedding and head counted apart, tied or not), over the update's time and 989 TFLOP/s (its
H100/H200 figure), times ppo_epochs, over the world size. verl's side also reports its own `perf/mfu/actor` (timed
inside its worker); both sides' MFU here use the trainer's `timing_s/update_actor` and the file's token counts.

vLLM: verl 0.9.1's `vllm` extra pins vllm==0.24.0, the bundle's. Every `from vllm... import` of verl 0.9.1 was
resolved against the vllm 0.24.0 wheel's modules (2026-12-03): all resolve on the dense bf16 path; the eight that do
not are in quantisation (fp8/fp4/QAT/modelopt), the delta weight-transfer option, or behind try/except fallbacks.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks import harness

PEAK_FLOPS = 989e12  # verl's get_device_flops for H100 / H200 (bf16 dense)
TARGET = "<= 0.5"
VERL_TOKEN_TOL, RLPOST_TOKEN_TOL, PROMPT_TOL = 1e-3, 1e-2, 1e-3
CAPS_MARK = "[verl_caps]"
REPO = Path(__file__).resolve().parents[1]


# ---- verl's FLOPs formula (Qwen2), reimplemented ----------------------------------------------------------------

def dense_params(cfg: Mapping[str, Any]) -> int:
    """verl 0.9.1's dense parameter count of a Qwen2 config (the embedding and the LM head both counted)."""
    h, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
    head_dim = int(cfg.get("head_dim") or h // heads)
    q = o = heads * head_dim
    kv = int(cfg["num_key_value_heads"]) * head_dim
    per_layer = 3 * h * int(cfg["intermediate_size"]) + h * (q + 2 * kv + o)
    return int(cfg["num_hidden_layers"]) * per_layer + 2 * int(cfg["vocab_size"]) * h


def train_flops(cfg: Mapping[str, Any], seqlens: Sequence[int]) -> float:
    """Forward + backward FLOPs of one pass over sequences of `seqlens` tokens, as verl 0.9.1 counts them."""
    h, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
    head_dim = int(cfg.get("head_dim") or h // heads)
    attn = 6 * sum(int(s) ** 2 for s in seqlens) * head_dim * heads * int(cfg["num_hidden_layers"])
    return 6.0 * dense_params(cfg) * sum(int(s) for s in seqlens) + attn


def mfu(cfg: Mapping[str, Any], seqlens: Sequence[int], seconds: float, epochs: int = 1, world: int = 1,
        peak: float = PEAK_FLOPS) -> float:
    """verl's actor MFU: train_flops x ppo_epochs / seconds / peak / world size."""
    return train_flops(cfg, seqlens) * epochs / seconds / peak / world


# ---- the work of each step, from the parquet both sides read ---------------------------------------------------

def expected_steps(data: Path, tokenizer: Any, prompts: int, n: int, steps: int, cap: int) -> list[dict[str, Any]]:
    """Per step (file order, `prompts` rows a step): each sample's prompt tokens (the chat-templated prompt) and
    response tokens (its cap, at most `cap`), the j-th sample of a row taking caps[j % len]."""
    import pandas as pd

    from benchmarks import workload

    df = pd.read_parquet(Path(data) / "train.parquet")
    out = []
    for k in range(steps):
        rows = df.iloc[k * prompts:(k + 1) * prompts]
        if len(rows) < prompts:
            raise ValueError(f"expected_steps: {data}/train.parquet has {len(df)} rows, step {k + 1} needs "
                             f"{(k + 1) * prompts}; write it for --steps {steps} (benchmarks.workload --steps)")
        p_tok, r_tok = [], []
        for _, row in rows.iterrows():
            p = workload.render_len(tokenizer, row["prompt"][0]["content"])
            caps = list(row["extra_info"]["response_caps"])
            for j in range(n):
                p_tok.append(p)
                r_tok.append(min(int(caps[j % len(caps)]), cap))
        out.append({"step": k + 1, "prompt_tokens": p_tok, "response_tokens": r_tok})
    return out


# ---- the two runs' logs ----------------------------------------------------------------------------------------

_CONSOLE = re.compile(r"(?:^|\s)step:(\d+) - (.*)$")


def _num(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def verl_rows(metrics: Path | None, log: Path | None = None) -> list[dict[str, Any]]:
    """verl's per-step metrics: its file logger's lines (`{"step": s, "data": {...}}`), else its console lines
    (`step:s - key:value - ...`); one flat dict a step, with `step`, sorted."""
    rows: dict[int, dict[str, Any]] = {}
    if metrics is not None and Path(metrics).exists():
        for line in Path(metrics).read_text().splitlines():
            if line.strip():
                item = json.loads(line)
                rows[int(item["step"])] = {"step": int(item["step"]), **item.get("data", {})}
    if not rows and log is not None and Path(log).exists():
        for line in Path(log).read_text(errors="replace").splitlines():
            m = _CONSOLE.search(line)
            if m is None:
                continue
            row: dict[str, Any] = {"step": int(m.group(1))}
            for part in m.group(2).split(" - "):
                key, _, value = part.rpartition(":")
                if key and _num(value) is not None:
                    row[key] = _num(value)
            rows[row["step"]] = row
    return [rows[s] for s in sorted(rows)]


def rlpost_rows(metrics: Path) -> list[dict[str, Any]]:
    """rlpost's per-step metrics (`trainer.logger` file: one flat JSON object a line, with `step`)."""
    if not Path(metrics).exists():
        return []
    rows = [json.loads(line) for line in Path(metrics).read_text().splitlines() if line.strip()]
    return sorted((r for r in rows if "step" in r), key=lambda r: int(r["step"]))


def caps_patched(log_text: str) -> int:
    """How many verl processes printed that the per-sample caps are on (0: verl ran without them)."""
    return sum(CAPS_MARK in line for line in log_text.splitlines())


# ---- the check and the goal ------------------------------------------------------------------------------------

def token_check(side: str, rows: Sequence[Mapping[str, Any]], expected: Sequence[Mapping[str, Any]],
                tol: float) -> dict[str, Any]:
    """Each logged step's mean response / prompt tokens against the file's; ok when every step is within `tol`
    (relative) and every expected step was logged."""
    by_step = {int(r["step"]): r for r in rows}
    steps, ok = [], True
    for exp in expected:
        row = by_step.get(int(exp["step"]))
        want_r = statistics.fmean(exp["response_tokens"])
        want_p = statistics.fmean(exp["prompt_tokens"])
        if row is None or "response_length/mean" not in row or "prompt_length/mean" not in row:
            steps.append({"step": exp["step"], "logged": False})
            ok = False
            continue
        dr = float(row["response_length/mean"]) / want_r - 1
        dp = float(row["prompt_length/mean"]) / want_p - 1
        good = abs(dr) <= tol and abs(dp) <= PROMPT_TOL
        ok = ok and good
        steps.append({"step": exp["step"], "logged": True, "response_mean": float(row["response_length/mean"]),
                      "expected_response_mean": want_r, "response_rel_diff": dr,
                      "prompt_mean": float(row["prompt_length/mean"]), "expected_prompt_mean": want_p,
                      "prompt_rel_diff": dp, "ok": good})
    return {"side": side, "tolerance": tol, "ok": ok, "steps": steps}


def _timed(rows: Sequence[Mapping[str, Any]], key: str, first: int) -> list[tuple[int, float]]:
    return [(int(r["step"]), float(r[key])) for r in rows if int(r["step"]) >= first and key in r]


def summarise(rlpost: Sequence[Mapping[str, Any]], verl: Sequence[Mapping[str, Any]],
              expected: Sequence[Mapping[str, Any]], model_cfg: Mapping[str, Any], caps_lines: int,
              command: str, first: int = 2, env: dict[str, Any] | None = None) -> harness.Result:
    """verl_c3's result: goal C3 (median step ratio, unpaired range), the token check, both sides' MFU."""
    res = harness.Result("verl_c3", command, 0, **({"env": env} if env is not None else {}))
    r_steps, v_steps = _timed(rlpost, "timing_s/step", first), _timed(verl, "timing_s/step", first)
    checks = {"rlpost": token_check("rlpost", rlpost, expected, RLPOST_TOKEN_TOL),
              "verl": token_check("verl", verl, expected, VERL_TOKEN_TOL)}
    same_work = checks["rlpost"]["ok"] and checks["verl"]["ok"] and caps_lines > 0
    res.extra["token_check"] = {**checks, "verl_caps_processes": caps_lines, "same_work": same_work}
    res.extra["steps_measured"] = {"rlpost": [s for s, _ in r_steps], "verl": [s for s, _ in v_steps]}
    res.extra["ratio_note"] = ("unpaired: two runs one after the other; ci_low/ci_high are the range of all "
                               "cross-step ratios, not a confidence interval")
    by_step = {int(e["step"]): e for e in expected}
    for side, rows in (("rlpost", rlpost), ("verl", verl)):
        steps = _timed(rows, "timing_s/step", first)
        if steps:
            res.timing(f"{side}_step_s", [t for _, t in steps])
        for phase in ("gen", "old_log_prob", "ref", "update_actor", "update_weights"):
            got = _timed(rows, f"timing_s/{phase}", first)
            if got:
                res.timing(f"{side}_{phase}_s", [t for _, t in got])
        mfus = [mfu(model_cfg, [p + r for p, r in zip(by_step[s]["prompt_tokens"], by_step[s]["response_tokens"])],
                    t) for s, t in _timed(rows, "timing_s/update_actor", first) if s in by_step]
        if mfus:
            res.timing(f"{side}_actor_mfu", mfus, unit="fraction of 989 TFLOP/s",
                       formula="verl 0.9.1 FlopsCounter (Qwen2) over timing_s/update_actor")
    warm = {side: dict(_timed(rows, "timing_s/step", 1)).get(1) for side, rows in (("rlpost", rlpost), ("verl", verl))}
    if warm["rlpost"] and warm["verl"]:  # what a run cut short after one step still tells
        res.metric("step1_rlpost_over_verl", warm["rlpost"] / warm["verl"], unit="ratio", rlpost_s=warm["rlpost"],
                   verl_s=warm["verl"], note="each run's first (warm-up) step alone: not goal C3, which times "
                   f"steps >= {first}")
    own = [v for _, v in _timed(verl, "perf/mfu/actor", first)]
    if own:
        res.timing("verl_actor_mfu_own", own, unit="fraction", source="verl's perf/mfu/actor (its worker's timer)")
    if not r_steps or not v_steps:
        missing = " and ".join(s for s, got in (("rlpost", r_steps), ("verl", v_steps)) if not got)
        res.not_measured("C3", TARGET, f"no timed step (>= {first}) from {missing}; see the session's logs")
        return res
    r, v = [t for _, t in r_steps], [t for _, t in v_steps]
    value = statistics.median(r) / statistics.median(v)
    stats = {"value": value, "ci_low": min(r) / max(v), "ci_high": max(r) / min(v)}
    res.reps = min(len(r), len(v))
    res.goal("C3", stats, TARGET, interval="range of cross-step ratios (unpaired)", same_work=same_work,
             rlpost_steps=r, verl_steps=v)
    if not same_work:
        res.goals["C3"]["met"] = None
        res.goals["C3"]["reason"] = "the two runs' token counts differ from the file's (token_check): not the same work"
    return res


# ---- rlpost's run ----------------------------------------------------------------------------------------------

def rlpost_command(data: Path, run_dir: Path, steps: int, prompts: int, prompt_len: int, cap: int) -> list[str]:
    """rlpost's GPU example script with the workload's batch and lengths (its own settings otherwise)."""
    return ["bash", str(REPO / "examples" / "grpo_trainer" / "run_qwen2_5_0_5b_gpu.sh"),
            f"data.train_batch_size={prompts}", f"data.max_prompt_length={prompt_len}",
            f"data.max_response_length={cap}", "data.shuffle=false", f"data.val_files={data / 'val.parquet'}",
            "actor_rollout_ref.rollout.ignore_eos=true", f"trainer.total_training_steps={steps}",
            "trainer.test_freq=-1", "trainer.val_before_train=false", "trainer.save_freq=-1",
            "trainer.logger=[console,file]", "trainer.experiment_name=c3_rlpost",
            f"trainer.default_local_dir={run_dir}"]


def run_rlpost(args: argparse.Namespace) -> Path:
    from benchmarks import main_ppo_runs, verl_side

    if not (args.data / "train.parquet").exists():
        verl_side.write_data(args)
    run_dir = Path("/tmp/c3_rlpost")
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "metrics.jsonl").unlink(missing_ok=True)
    cmd = rlpost_command(args.data, run_dir, args.steps, args.prompts, args.prompt_len, args.cap)
    env = {"MODEL_PATH": str(args.model_dir), "DATA_DIR": str(args.data), "N_GPUS": "1"}
    args.session.mkdir(parents=True, exist_ok=True)
    got = main_ppo_runs.launch(cmd, env, run_dir, args.session / "rlpost_stdout.log", "rlpost",
                               timeout_s=args.timeout)
    out = args.session / "rlpost_metrics.jsonl"
    out.write_text((run_dir / "metrics.jsonl").read_text() if (run_dir / "metrics.jsonl").exists() else "")
    print(f"[verl_c3] rlpost: rc {got.rc} timed_out {got.timed_out}, {len(got.rows)} steps -> {out}")
    return out


def summary(args: argparse.Namespace) -> Path:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(args.model_dir))
    cfg = json.loads((args.model_dir / "config.json").read_text())
    expected = expected_steps(args.data, tok, args.prompts, args.n, args.steps, args.cap)
    log = args.session / "verl_stdout.log"
    verl = verl_rows(args.session / "verl_metrics.jsonl", log)
    rlpost = rlpost_rows(args.session / "rlpost_metrics.jsonl")
    caps = caps_patched(log.read_text(errors="replace")) if log.exists() else 0
    res = summarise(rlpost, verl, expected, cfg, caps, harness.command_line())
    res.extra["params"] = harness.params(args)
    path = res.write(session=args.session)
    g = res.goals["C3"]
    print(f"[verl_c3] C3 {g['value']} [{g['ci_low']}, {g['ci_high']}] target {g['target']} met {g['met']}; same "
          f"work {res.extra['token_check']['same_work']} -> {path}")
    return path


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from benchmarks import workload

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="what", required=True)
    for name in ("rlpost", "summary"):
        p = sub.add_parser(name)
        workload.add_arguments(p)
        p.add_argument("--data", type=Path, required=True, help="the workload's parquet folder (both sides')")
        p.add_argument("--session", type=Path, required=True, help="the session's results folder")
        p.add_argument("--steps", type=int, default=5)
        p.add_argument("--prompt-len", type=int, default=192)
        if name == "rlpost":
            p.add_argument("--timeout", type=int, default=170, help="seconds before the run is killed")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    (run_rlpost if args.what == "rlpost" else summary)(args)


if __name__ == "__main__":
    sys.exit(main())
