"""Issue 49's goals (7B at scale on four H200s, Ulysses, SGLang, no-sync accumulation) from a session's result
files, written as `goals_49.json` in the harness schema so that `session_summary --goals 49` files them.

    python -m benchmarks.goals_49 benchmarks/results/<date>_h200x4

The files are the ones `benchmarks/gpu_session_b.sh` writes (each part's `--json-out`); a goal whose file is absent
or holds no usable row is written as not measured, naming the file and the part that makes it. Goals no benchmark
can produce yet carry `NOT_BUILT`'s reason. MFU is 6·N·tokens (update) and 2·N·tokens (old_log_prob) over
989 TFLOP/s, with N counted from the limits file's model shape and the tokens per GPU per step from `main_ppo`'s
throughput x step time.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from benchmarks import harness

PEAK = 989e12  # H100/H200 dense bf16, the MFU denominator

# Goal id -> target (issue 49).
GOALS = {
    "B1": "<= 1.10",           # 7B step on 4 GPUs against the sum of its limits (limits before and after)
    "B2": ">= 0.92",           # 7B generation in the loop against bare (bare / loop)
    "B3": "<= 0.15",           # 7B weight sync on 4 GPUs, seconds
    "B4_update": ">= 0.42",    # 7B update MFU (6·N·tokens)
    "B4_old_log_prob": ">= 0.50",  # 7B old_log_prob MFU (2·N·tokens)
    "B5": ">= 0.95",           # 7B weak scaling 2 -> 4 GPUs: t(2) / t(4) at the same prompts per GPU
    "B6": ">= 4000",           # 7B whole-step tokens/s/GPU, 28 + 512 workload
    "B6_realistic": "none (reported beside B6)",  # the same on the long-tailed workload
    "M1": ">= 1.00",           # MoE via main_ppo, 4 GPUs, expert parallelism: steps done / asked, both replays
    "D1_16k": ">= 0.85",       # Ulysses SP2 / SP1 tokens/s per GPU at 16k (2 GPUs)
    "D1_32k": ">= 0.92",       # the same at 32k
    "D2_time": "<= 0.6",       # fully async: time to the same trained samples against synchronous
    "D2_overlap": "<= 1.05",   # step / max(trainer phases, rollout)
    "D3": ">= 0.90",           # SGLang in the loop against a bare SGLang engine
    "NOSYNC": ">= 1.00",       # update_actor without no-sync / with it, 2 FSDP ranks with accumulation
    "T1": ">= 1.00",           # multi-turn agent loops with rollout TP 2: steps done / asked, the worse engine
}
T1_ENGINES = ("vllm", "sglang")  # the issue asks for both
NOT_BUILT: dict[str, str] = {}  # goals no benchmark can produce yet, with why
MOE_REPLAYS = ("off", "r2")  # M1 asks for router replay off and on
# M1's part not built: what the goal's met says until it is
NO_EP = ("expert parallelism is not built: FSDP shards the experts with every other weight and vLLM's tensor "
         "parallelism splits each expert (rollout.expert_parallel_size is refused; vLLM's CPU fused-MoE kernel "
         "crashed with enable_expert_parallel, so no CPU test could check the weight sync under it)")
# Files of the session (names set by gpu_session_b.sh) and the part that writes each.
FILES = {"limits_before": ("limits_7b_before.json", "b1a"), "limits_after": ("limits_7b_after.json", "b1b"),
         "scale4": ("scale_7b_4gpu.json", "b1a"), "scale2": ("scale_7b_2gpu.json", "b1b"),
         "ulysses": ("ulysses.json", "d1"), "sglang": ("sglang.json", "d3"),
         "nosync_on": ("scale_nosync_on.json", "d1"), "nosync_off": ("scale_nosync_off.json", "d1"),
         "multiturn_tp": ("multiturn_tp.json", "t1v"),
         "scale4_realistic": ("scale_7b_4gpu_realistic.json", "b1c"),
         "async_d2": ("async_d2.json", "d2a"),
         "moe": ("moe.json", "m1a")}  # t1s, d2b, d2c and m1b add their runs to the files of t1v, d2a and m1a


def qwen2_params(cfg: dict[str, Any]) -> int:
    """Parameters of a Qwen2-architecture model from its shape (embedding, q/k/v with biases, o, gated MLP, norms,
    and the output head unless tied)."""
    h, inter, layers, vocab = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
    kv = cfg["num_key_value_heads"] * h // cfg["num_attention_heads"]
    per_layer = (h * h + h) + 2 * (h * kv + kv) + h * h + 3 * h * inter + 2 * h
    head = 0 if cfg.get("tie_word_embeddings") else vocab * h
    return vocab * h + layers * per_layer + h + head


def _load(folder: Path, key: str) -> dict[str, Any] | None:
    path = folder / FILES[key][0]
    return json.loads(path.read_text()) if path.is_file() else None


def _missing(key: str) -> str:
    name, part = FILES[key]
    return f"{name} absent or without a measured row: part {part} of gpu_session_b.sh did not run or was cut"


def _row(res: dict[str, Any] | None, gpus: int) -> dict[str, Any] | None:
    """The measured `main_ppo` row of `gpus` GPUs in a bench_scale result (None when absent or failed)."""
    for r in (res or {}).get("results", []):
        if r.get("gpus") == gpus and "s_per_step" in r and "error" not in r:
            return r
    return None


def _limit_sum(res: dict[str, Any]) -> float | None:
    """The one `sum_limits_s_*` metric of a limits result (one batch size per file)."""
    sums = [m["value"] for k, m in res.get("metrics", {}).items() if k.startswith("sum_limits_s_")]
    return sums[0] if len(sums) == 1 else None


def _metric(res: dict[str, Any], prefix: str) -> float | None:
    vals = [m["value"] for k, m in res.get("metrics", {}).items() if k.startswith(prefix)]
    return vals[0] if len(vals) == 1 else None


def derive(folder: Path) -> harness.Result:
    """Every issue-49 goal from the files of `folder`: measured ones with value, interval and met, the rest not
    measured with the reason."""
    folder = Path(folder)
    res = harness.Result("goals_49", harness.command_line(), 0)
    for gid, reason in NOT_BUILT.items():
        res.not_measured(gid, GOALS[gid], reason)
    before, after = _load(folder, "limits_before"), _load(folder, "limits_after")
    row4, row2 = _row(_load(folder, "scale4"), 4), _row(_load(folder, "scale2"), 2)
    _b_goals(res, before, after, row4, row2)
    _b6_realistic(res, _row(_load(folder, "scale4_realistic"), 4), row4)
    _d_goals(res, folder)
    _d2_goals(res, _load(folder, "async_d2"))
    _t1_goal(res, _load(folder, "multiturn_tp"))
    _m1_goal(res, _load(folder, "moe"))
    return res


def _b_goals(res: harness.Result, before: dict | None, after: dict | None, row4: dict | None, row2: dict | None
             ) -> None:
    lims = [x for x in (before, after) if x is not None and _limit_sum(x)]
    if row4 is None:
        for gid in ("B1", "B2", "B3", "B4_update", "B4_old_log_prob", "B6"):
            res.not_measured(gid, GOALS[gid], _missing("scale4"))
    else:
        cmd = "bench_scale --arch 7b --gpus 4 (scale_7b_4gpu.json)"
        phases = row4["phases_s"]
        res.goal("B3", {"value": phases.get("update_weights")}, GOALS["B3"], reps=row4["steps_measured"], command=cmd)
        res.goal("B6", {"value": row4["tokens_per_s_per_gpu"]}, GOALS["B6"], reps=row4["steps_measured"], command=cmd)
        if not lims:
            for gid in ("B1", "B2", "B4_update", "B4_old_log_prob"):
                res.not_measured(gid, GOALS[gid], _missing("limits_before") + "; and " + _missing("limits_after"))
        else:
            _against_limits(res, lims, row4, cmd)
    if row4 is None or row2 is None or row2["prompts"] * 2 != row4["prompts"]:
        why = _missing("scale2") if row2 is None else (_missing("scale4") if row4 is None else
                                                         "the 2- and 4-GPU rows differ in prompts per GPU")
        res.not_measured("B5", GOALS["B5"], why)
    else:
        lo = row2["s_per_step_range"][0] / row4["s_per_step_range"][1]
        hi = row2["s_per_step_range"][1] / row4["s_per_step_range"][0]
        res.goal("B5", {"value": row2["s_per_step"] / row4["s_per_step"], "ci_low": lo, "ci_high": hi},
                 GOALS["B5"], reps=min(row2["steps_measured"], row4["steps_measured"]),
                 command="bench_scale --arch 7b --gpus 2 | 4 (scale_7b_2gpu.json, scale_7b_4gpu.json)",
                 interval="ranges of the measured steps, not a confidence interval")


def _b6_realistic(res: harness.Result, real: dict | None, row4: dict | None) -> None:
    """B6 on the long-tailed workload: reported beside B6, no target of its own."""
    if real is None:
        res.not_measured("B6_realistic", GOALS["B6_realistic"], _missing("scale4_realistic"))
        return
    res.goals["B6_realistic"] = {
        "value": real["tokens_per_s_per_gpu"], "ci_low": None, "ci_high": None, "target": GOALS["B6_realistic"],
        "met": None, "command": "bench_scale --arch 7b --gpus 4 --workload realistic (scale_7b_4gpu_realistic.json)",
        "reps": real["steps_measured"], "reason": "reported beside B6 (the issue gives it no target)",
        "s_per_step": real["s_per_step"], "phases_s": real["phases_s"],
        "fixed_workload_tokens_per_s_per_gpu": (row4 or {}).get("tokens_per_s_per_gpu")}


def _against_limits(res: harness.Result, lims: list[dict], row4: dict, cmd: str) -> None:
    sums = [_limit_sum(x) for x in lims]
    lo, hi = row4["s_per_step_range"]
    more: dict[str, Any] = {"limits_s": sums,
                            "interval": "measured steps' range over the limit runs' range, not a confidence interval"}
    if len(sums) == 2:
        pair = harness.limit_pair([sums[0]], [sums[1]])
        more.update(limit_drift=pair["drift"], limit_void=pair["void"])
    else:
        more["limit_note"] = "limits ran once only (not before and after)"
    value = row4["s_per_step"] / statistics.fmean(sums)
    goal = res.goal("B1", {"value": value, "ci_low": lo / max(sums), "ci_high": hi / min(sums)},
                    GOALS["B1"], reps=row4["steps_measured"], command=cmd + " against bench_limits --arch 7b", **more)
    if more.get("limit_void"):
        goal["met"] = None
        goal["reason"] = f"limits drifted {more['limit_drift']:.1%} between before and after: void"
    gens = [g for g in (_metric(x, "gen_s_") for x in lims) if g]
    phases = row4["phases_s"]
    if gens and phases.get("gen"):
        res.goal("B2", {"value": statistics.fmean(gens) / phases["gen"]}, GOALS["B2"], reps=row4["steps_measured"],
                 command=cmd, bare_gen_s=gens, loop_gen_s=phases["gen"])
    else:
        res.not_measured("B2", GOALS["B2"], "no gen phase in the limits or the 4-GPU row")
    model = lims[0].get("model", {})
    if "hidden_size" not in model:
        for gid in ("B4_update", "B4_old_log_prob"):
            res.not_measured(gid, GOALS[gid], "the limits file has no model shape to count N from")
        return
    n = qwen2_params(model)
    tokens = row4["tokens_per_s_per_gpu"] * row4["s_per_step"]  # per GPU per step
    for gid, phase, k in (("B4_update", "update_actor", 6), ("B4_old_log_prob", "old_log_prob", 2)):
        if phases.get(phase):
            res.goal(gid, {"value": k * n * tokens / phases[phase] / PEAK}, GOALS[gid], reps=row4["steps_measured"],
                     command=cmd, params=n, tokens_per_gpu=tokens, phase_s=phases[phase])
        else:
            res.not_measured(gid, GOALS[gid], f"no {phase} phase in the 4-GPU row")


def _d_goals(res: harness.Result, folder: Path) -> None:
    uly = _load(folder, "ulysses")
    for gid, length in (("D1_16k", "16384"), ("D1_32k", "32768")):
        entry = (uly or {}).get("results", {}).get(length, {})
        if "sp2_over_sp1_tokens_per_s" not in entry:
            res.not_measured(gid, GOALS[gid], _missing("ulysses") if uly is None else
                             f"ulysses.json has no SP2/SP1 pair at L={length} (out of memory or not run)")
            continue
        one, two = entry["1"], entry["2"]
        res.goal(gid, {"value": entry["sp2_over_sp1_tokens_per_s"],
                       "ci_low": two["tokens_per_s_per_gpu_min"] / one["tokens_per_s_per_gpu_max"],
                       "ci_high": two["tokens_per_s_per_gpu_max"] / one["tokens_per_s_per_gpu_min"]},
                 GOALS[gid], reps=len(one["all_s"]), command=f"bench_ulysses --lengths {length}",
                 sp1_tokens_per_s_per_gpu=one["tokens_per_s_per_gpu"],
                 interval="ranges of the timed updates, not a confidence interval")
    sgl = _load(folder, "sglang")
    ratios = {k: m["value"] for k, m in (sgl or {}).get("metrics", {}).items()
              if k.startswith("sglang_loop_over_bare_") and m.get("value")}
    if ratios:
        key = max(ratios, key=lambda k: int(k.rsplit("_", 1)[1]))  # the largest batch measured
        res.goal("D3", {"value": ratios[key]}, GOALS["D3"], reps=sgl["reps"], command="bench_sglang (sglang.json)",
                 metric=key, all_batches=ratios)
    else:
        res.not_measured("D3", GOALS["D3"], _missing("sglang"))
    on, off = _row(_load(folder, "nosync_on"), 2), _row(_load(folder, "nosync_off"), 2)
    if on is None or off is None:
        res.not_measured("NOSYNC", GOALS["NOSYNC"], _missing("nosync_on" if on is None else "nosync_off"))
    else:
        res.goal("NOSYNC", {"value": off["phases_s"]["update_actor"] / on["phases_s"]["update_actor"]},
                 GOALS["NOSYNC"], reps=min(on["steps_measured"], off["steps_measured"]),
                 command="bench_scale --arch 0.5b --gpus 2, no-sync on | off (scale_nosync_on/off.json)",
                 update_s_on=on["phases_s"]["update_actor"], update_s_off=off["phases_s"]["update_actor"],
                 step_s_on=on["s_per_step"], step_s_off=off["s_per_step"])


def _d2_goals(res: harness.Result, d2: dict | None) -> None:
    """D2_time: the fully-async run's time to train the same samples over the synchronous hybrid run's (one-step-off
    beside it); D2_overlap: the fully-async run's median step / max(trainer busy, rollout busy)."""
    runs = (d2 or {}).get("runs", {})
    sync, off, full = (runs.get(c, {}) for c in ("sync_hybrid", "one_step_off", "fully_async"))
    cmd = "bench_async_d2 (async_d2.json)"
    if d2 is None:
        for gid in ("D2_time", "D2_overlap"):
            res.not_measured(gid, GOALS[gid], _missing("async_d2"))
        return
    missing = [c for c, r in (("sync_hybrid", sync), ("fully_async", full)) if not r.get("time_to_samples_s")]
    if missing:
        res.not_measured("D2_time", GOALS["D2_time"], f"async_d2.json has no finished {' and '.join(missing)} run "
                         "(calls d2a and d2c of gpu_session_b.sh)")
    else:
        beside = ({"one_step_off_over_sync": off["time_to_samples_s"] / sync["time_to_samples_s"]}
                  if off.get("time_to_samples_s") else {})
        res.goal("D2_time", {"value": full["time_to_samples_s"] / sync["time_to_samples_s"]}, GOALS["D2_time"],
                 reps=1, command=cmd, interval="one run per configuration: no interval",
                 time_to_samples_s={c: r.get("time_to_samples_s") for c, r in runs.items()}, **beside)
    if not full.get("overlap"):
        res.not_measured("D2_overlap", GOALS["D2_overlap"], "async_d2.json has no fully_async step after the first "
                         "with the idle metrics (call d2c of gpu_session_b.sh)")
    else:
        res.goal("D2_overlap", {"value": full["overlap_median"], "ci_low": min(full["overlap"]),
                                "ci_high": max(full["overlap"])}, GOALS["D2_overlap"], reps=len(full["overlap"]),
                 command=cmd, interval="range of the steps after the first, not a confidence interval",
                 one_step_off_overlap=off.get("overlap_median"))


def _t1_goal(res: harness.Result, t1: dict | None) -> None:
    """T1: the fraction of the asked `main_ppo` steps that completed at rollout TP 2, the worse engine; judged only
    when every engine of `T1_ENGINES` ran (bench_multiturn_tp.py's multiturn_tp.json)."""
    runs = {e: p["main_ppo"] for e, p in (t1 or {}).get("engines", {}).items() if p.get("main_ppo")}
    if not runs:
        res.not_measured("T1", GOALS["T1"], _missing("multiturn_tp"))
        return
    done = {e: r["steps_done"] / max(r["steps_asked"], 1) for e, r in runs.items()}
    checks = {e: {k: p["check"].get(k) for k in ("rows", "rows_identical", "tool_turn_rows")}
              for e, p in t1["engines"].items() if p.get("check")}
    goal = res.goal("T1", {"value": min(done.values())}, GOALS["T1"], reps=min(r["steps_done"] for r in runs.values()),
                    command="bench_multiturn_tp (multiturn_tp.json)", steps_done_fraction=done,
                    step_s={e: r["step_s"] for e, r in runs.items()}, tp2_against_tp1=checks)
    absent = [e for e in T1_ENGINES if e not in runs]
    if absent:
        goal["met"] = None
        goal["reason"] = (f"main_ppo at TP 2 did not run on {', '.join(absent)}: the goal asks for "
                          f"{' and '.join(T1_ENGINES)}")


def _m1_goal(res: harness.Result, moe: dict | None) -> None:
    """M1: the fraction of the asked `main_ppo` steps that completed, the worse of the two replay settings, with
    each run's figures beside it (bench_moe.py's moe.json); met only with expert parallelism, which is not built."""
    runs = (moe or {}).get("runs", {})
    if not runs:
        res.not_measured("M1", GOALS["M1"], _missing("moe"))
        return
    done = {r: run["steps_done"] / max(run["steps_asked"], 1) for r, run in runs.items()}
    figures = {r: {k.removesuffix(":median"): v for k, v in run.items() if k.endswith(":median")}
               for r, run in runs.items()}
    goal = res.goal("M1", {"value": min(done.values())}, GOALS["M1"],
                    reps=min(run["steps_done"] for run in runs.values()), command="bench_moe (moe.json)",
                    steps_done_fraction=done, step_s={r: run["step_s"] for r, run in runs.items()},
                    medians=figures, params={r: (run["params_total"], run["params_active"]) for r, run in runs.items()})
    absent = [r for r in MOE_REPLAYS if r not in runs]
    shapes = {(run["gpus"], run["layers"], run["params_total"]) for run in runs.values()}
    if absent:
        goal["met"], goal["reason"] = None, f"router replay {', '.join(absent)} did not run (the goal asks for both)"
    elif len(shapes) > 1:
        goal["met"], goal["reason"] = None, f"the runs differ in (GPUs, layers, parameters): {sorted(shapes)}"
    else:
        goal["met"], goal["reason"] = False, f"steps done {min(done.values()):.2f} of those asked, but {NO_EP}"


def main(argv: list[str] | None = None) -> Path:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path)
    args = ap.parse_args(argv)
    path = derive(args.folder).write(path=args.folder / "goals_49.json")
    print(f"[goals_49] wrote {path}")
    return path


if __name__ == "__main__":
    main()
