"""Every benchmark script's result, built from a recorded sample of its raw timings (what its GPU run collects),
follows the harness schema: the validator passes, each headline metric is the median of the sample's values
(worked out by hand below), the old payload sits beside the metrics, and the file lands where `write` says."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

from benchmarks import harness  # noqa: E402

pytestmark = pytest.mark.timeout(60)

ENV = {"commit": "c0ffee1", "dirty": False, "date": "2026-12-02T05:00:00+00:00", "host": "h", "gpu": "NVIDIA H200"}
NS = argparse.Namespace


def _rollout_logprobs() -> Any:
    import bench_rollout_logprobs as b

    rows = [b.summarize(64, 8, {"none": [2.0, 1.0, 3.0], "dicts": [3.0, 5.0, 4.0], "flat": [2.5, 2.0, 3.0]})]
    return b.build_result(NS(reps=3, seqs=[64]), rows, ENV), "gen_s_dicts_seqs64", 4.0, "rows"


def _chunk_stats() -> Any:
    import bench_chunk_stats as b

    measured = {name: {"median_s": 0.0, "all_s": [0.3, 0.1, 0.2]} for name in b.VARIANTS} | {"max_entropy_diff": 0.0}
    return b.build_result(NS(reps=3), measured, ENV), "chunk_stats_s", 0.2, "variants"


def _offload() -> Any:
    import bench_offload as b

    times = {m: {"offload": [1.0, 3.0, 2.0], "onload": [0.5, 0.5, 0.6]} for m in ("plain", "rlpost")}
    return b.build_result(NS(reps=3, gb=1.0), 2**30, times, ENV), "rlpost_onload_s", 0.5, "offload"


def _collectives() -> Any:
    import bench_collectives as b

    row = {"name": "model all-gather bf16", "bytes": 120, "ms": 2.0, "ms_range": [1.0, 3.0], "ms_all": [1.0, 3.0, 2.0],
           "bus_gb_per_s": 1.0, "world": 2}
    return b.build_result(NS(reps=3), [row], ENV), "model_all_gather_bf16_x2_ms", 2.0, "results"


def _lora() -> Any:
    import bench_lora as b

    run = {"mode": "full", "rc": 0, "timing_s/step": {**harness.spread([9.0, 7.0, 8.0]), "all": [9.0, 7.0, 8.0]}}
    return b.build_result(NS(arch="0.5b", steps=4, rank=32, prompts=32, response_len=512, limits=False), [run],
                          ENV), "full_step_s", 8.0, "runs"


def _async() -> Any:
    import bench_async as b

    run = {"config": "hybrid_2gpu", "response_len": 512, "step_s": [10.0, 12.0, 11.0, 30.0], "gen_tokens_per_s": 1.0}
    failed = {"config": "split_1+1", "response_len": 512, "error": "rc=1"}
    args = NS(prompts=64, n=8, gen_heavy=False, steps=5)
    return b.build_result(args, [run, failed], ENV), "hybrid_2gpu_512_step_s", 11.5, "results"


def _scale() -> Any:
    import bench_scale as b

    row = {"gpus": 2, "tp": 1, "prompts": 128, "n": 8, "step_s": [5.0, 6.0, 4.0], "tokens_per_s_per_gpu": 1.0}
    return b.build_result(NS(arch="0.5b", steps=4), [row, {"gpus": 4, "error": "x"}], ENV), "2gpu_tp1_128x8_step_s", \
        5.0, "results"


def _dispatch() -> Any:
    import bench_dispatch as b

    row = {"ranks": 2, "rows": 16, "input_bytes": 1, **{s: b.side_summary([0.2, 0.4, 0.3]) for s in b.SIDES}}
    return b.build_result(NS(reps=3), [row], ENV), "torch_x2_s", 0.3, "results"


def _rank0_load() -> Any:
    import bench_rank0_load as b

    def rep(seconds: float) -> list[dict[str, float]]:
        return [{"seconds": seconds, "peak_rss_gib": 1.0, "checksum": 5.0},
                {"seconds": seconds - 1, "peak_rss_gib": 2.0, "checksum": 6.0}]

    runs = {"plain": [rep(10.0), rep(12.0), rep(11.0)], "rank0": [rep(6.0), rep(5.0), rep(7.0)]}
    res = b.build_result(NS(gpus=2, reps=3), {"hidden_size": 8}, runs, ENV)
    assert res.extra["summary"]["same_shards"] is True and res.metrics["plain_peak_rss_gib"]["value"] == 3.0
    return res, "rank0_slowest_rank_s", 6.0, "summary"


def _update_profile() -> Any:
    import bench_update_profile as b

    raw = {"rows": 512, "rlpost_update_s": 2.5, "bare_bf16_s": 2.0, "profile_wall_s": 3.0, "profile_top_by_time": "t"}
    res = b.build_result(NS(prompts=64), raw, ENV)
    assert res.extra["profile"] == {"profile_wall_s": 3.0, "profile_top_by_time": "t"}
    return res, "rlpost_update_s", 2.5, "rows"


def _varlen_gqa() -> Any:
    import bench_varlen_gqa as b

    sides = {"repeat": {"fwd": b.summary([2.0, 4.0]), "fwd_bwd": b.summary([6.0, 8.0])},
             "native": {"fwd": b.summary([1.0, 2.0]), "fwd_bwd": b.summary([3.0, 5.0])}}
    raw = {"varlen_kernel": False, "tokens": 24, "sides": sides, "speedup": {"fwd": 2.0, "fwd_bwd": 1.75}}
    return b.build_result(NS(rounds=1, reps=2), raw, ENV), "native_fwd_bwd_ms", 4.0, "sides"


def _gen_ablate() -> Any:
    import bench_gen_ablate as b

    engines = {"bare": {"engine_start_s": 30.0, "kwargs": {}, "shapes": {"rows": b.shape_summary([4.0, 6.0, 5.0])}}}
    return b.build_result(NS(reps=3), engines, ENV), "bare_rows_s", 5.0, "engines"


def _kernels() -> Any:
    import bench_kernels as b

    per = {"old_log_prob_s": [1.0, 3.0, 2.0], "update_s": [4.0, 4.0, 5.0]}
    raw = {"fixed": {"packed": {"median_old_log_prob_s": 2.0, "reps": per}, "tokens": {"real": 1, "padded": 2}}}
    args = NS(batches=["fixed"], variants=["packed"], prompt_real=28, toy=False, reps=3)
    res = b.build_result(args, raw, ENV)
    assert res.benchmark == "kernels_fixed_prompt28"
    return res, "fixed_packed_update_s", 4.0, "fixed"


def _actor_gap() -> Any:
    import bench_actor_gap as b

    raw = {name: {"all_s": [1.0, 2.0, 3.0]} for name in b.PHASES} | {"ratios": {"old_log_prob": 0.5, "update": 0.8}}
    res = b.build_result(NS(toy=False, tag="bf16", reps=3), raw, ENV)
    assert res.benchmark == "actor_gap_bf16" and res.metrics["update_bare_over_rlpost"]["value"] == 0.8
    return res, "bare_train_s", 2.0, "ratios"


def _sglang() -> Any:
    import bench_sglang as b

    def mode(tps: float, times: list[float]) -> dict[str, Any]:
        return {"64": {"s": 1.0, "all_s": times, "gen_tokens_per_s": tps}}

    runs = {"sglang:bare": [mode(100.0, [1.0, 2.0])], "sglang:loop": [mode(90.0, [3.0, 4.0]), mode(80.0, [5.0])]}
    args = NS(prompts=[64], n=8, prompt_len=512, response_len=512, reps=2, rounds=2, gpu_memory_utilization=0.5)
    res = b.build_result(args, runs, ENV)
    # the loop's rounds: 90 and 80 tokens/s, the upper median of two (summarize's rule) 90; over the bare 100
    assert res.metrics["sglang_loop_over_bare_64"]["value"] == pytest.approx(0.9)
    return res, "sglang_loop_64_gen_s", 4.0, "summary"


def _knobs() -> Any:
    import bench_knobs as b

    update = {"baseline": {**b.seconds_summary([2.0, 1.0, 3.0]), "peak_GiB": 4.0, "grad_norm": 1.0},
              "no_ckpt": {**b.seconds_summary([1.0, 1.0, 1.5]), "peak_GiB": 8.0, "grad_norm": 1.0}}
    sync = {"entries": 3, "per_tensor": {**b.seconds_summary([0.1, 0.3, 0.2]), "extra_peak_GiB": 0.0}}
    args = NS(world=2, reps=3, tiny=True, settings=["baseline", "no_ckpt"])
    res = b.build_result({"update": update, "sync": sync}, {"hidden_size": 8}, args, ENV)
    assert res.metrics["update_no_ckpt_s"]["s_over_baseline"] == 0.5
    return res, "sync_per_tensor_s", 0.2, "results"


def _gen_concurrent() -> Any:
    import bench_gen_concurrent as b

    joined = {"gen": {"solo": [[2.0], [1.0], [4.0]], "all": [[2.0, 4.0], [1.0, 2.0], [4.0, 8.0]]}}
    out = {"ranks": [{"threads": 1}], "times": joined, "summary": b.summarize(joined)}
    res = b.build_result(NS(gpus=2, reps=3), out, ENV)
    paired = res.metrics["gen_paired_efficiency"]  # every repetition's solo / slowest is 0.5: no spread
    assert paired["value"] == pytest.approx(0.5) and paired["ci_low"] == pytest.approx(0.5)
    return res, "gen_all_s", 4.0, "summary"


def _ulysses() -> Any:
    import bench_ulysses as b

    runs = [{"s": s, "peak_GiB": 1.0, "resident_GiB": 0.5, "grad_norm": 1.0} for s in (2.0, 4.0, 3.0)]
    results = {"4096": {"1": b.summarize(runs, 300), "2": {"oom": True}}}
    res = b.build_result(results, {"hidden_size": 8}, NS(reps=3, tiny=True), ENV)
    assert "L4096_sp2_update_s" not in res.metrics and res.metrics["L4096_sp1_update_s"]["tokens_per_s_per_gpu"] == 100
    return res, "L4096_sp1_update_s", 3.0, "results"


def _multiturn() -> Any:
    import bench_multiturn as b

    row = {"prompts": 4, "multi_turn": b.summary([2.0, 4.0], 64), "single_turn": b.summary([1.0, 2.0], 64),
           "ratio": 0.5, "ratio_per_rep": [0.5, 0.5], "meets_target": False, "max_in_flight": [4, 4]}
    res = b.build_result(NS(reps=2), [row], ENV)
    assert res.metrics["B4_ratio"]["met"] is False and res.metrics["B4_ratio"]["target"] == ">= 0.7"
    return res, "B4_multi_turn_s", 3.0, "results"


def _grpo_step() -> Any:
    import bench_grpo_step as b

    steps = [{"gen": g, "step": 2 * g, "tokens": 10} for g in (1.0, 3.0, 2.0)]
    steps[0]["gen_wake"] = 0.1  # reported by the worker on one step only
    raw = {"per_batch": {"64": {"all_step_s": steps, "ratios": {"gen": 0.95, "step_over_sum_limits": 1.2}}}}
    res = b.build_result(NS(reps=3, n=8), raw, ENV)
    assert res.metrics["64x8_gen_wake_s"]["values"] == [0.1] and "64x8_tokens_s" not in res.metrics
    assert res.metrics["64x8_ratio_step_over_sum_limits"]["target"] == 1.5
    return res, "64x8_step_s", 4.0, "per_batch"


def _micro_sweep() -> Any:
    import bench_grpo_step as b

    raw = {"sweep": [{"spec": "tm=8", "step_s": {"update_actor_only": 1.5}}]}
    return b.sweep_result(NS(), raw, ENV), "sweep_tm=8_update_actor_only_s", 1.5, "sweep"


def _limits() -> Any:
    import bench_limits as b

    raw = {"env": dict(ENV), "per_batch": {"64": {"gen": {"s": 2.0, "all_s": [3.0, 2.0, 1.0]}, "fwd": {"s": 0.5},
                                                  "train": {"s": 1.5}, "sum_limits_s": 4.5}}, "reload": {"s": 0.0}}
    res = b.build_result(NS(arch="0.5b", gen_reps=3, n=8, json_out=Path("x.json")), raw)
    assert res.metrics["gen_s_64x8"]["values"] == [3.0, 2.0, 1.0] and res.extra["args"]["json_out"] == "x.json"
    return res, "sum_limits_s_64x8", 4.5, "reload"


def _gen_variance() -> Any:
    import bench_gen_variance as b

    records = [{"variant": "default", "wall_s": w} for w in (5.0, 4.0, 6.0)] + [{"variant": "gc_off", "wall_s": 4.5}]
    raw = {"env": dict(ENV), "by_variant": {"default": {}, "gc_off": {}}, "records": records}
    return b.build_result(NS(reps=3), raw), "wall_s_default", 5.0, "records"


def _gen_alternate() -> Any:
    import bench_gen_alternate as b

    rounds = [{"bare": {"s": 2.0}, "rlpost": {"gen": 4.0}, "gen_ratio": 0.5},
              {"bare": {"s": 2.0}, "rlpost": {"gen": 1.0}, "gen_ratio": 2.0}]
    res = b.build_result(NS(), {"env": dict(ENV), "rounds": rounds})
    assert res.metrics["gen_bare_over_rlpost"]["values"] == [0.5, 2.0]
    return res, "gen_bare_over_rlpost", 1.0, "rounds"  # geometric mean of 0.5 and 2


CASES: dict[str, Callable[[], Any]] = {f.__name__.lstrip("_"): f for f in (
    _limits, _gen_variance, _gen_alternate, _rollout_logprobs, _chunk_stats, _offload, _collectives, _lora, _async, _scale, _dispatch, _rank0_load,
    _update_profile, _varlen_gqa, _gen_ablate, _kernels, _actor_gap, _sglang, _knobs, _gen_concurrent, _ulysses,
    _multiturn, _grpo_step, _micro_sweep)}


@pytest.mark.parametrize("name", sorted(CASES))
def test_result_of_a_recorded_sample_follows_the_schema(name: str, tmp_path: Path) -> None:
    res, metric, median, payload = CASES[name]()
    data = res.to_dict()
    harness.validate(data)
    assert data["commit"] == "c0ffee1" and data["gpu"] == "NVIDIA H200" and payload in data
    assert data["metrics"][metric]["value"] == pytest.approx(median)
    path = res.write(root=tmp_path)
    assert path == tmp_path / "2026-12-02_h200" / f"{res.benchmark}.json"
    harness.validate(json.loads(path.read_text()))


def test_every_benchmark_script_uses_the_harness() -> None:
    """No script under benchmarks/ keeps a private result format: each one names the harness."""
    left = subprocess.run(["grep", "-L", "harness", *map(str, sorted((REPO / "benchmarks").glob("bench_*.py")))],
                          capture_output=True, text=True).stdout.split()
    assert left == []
