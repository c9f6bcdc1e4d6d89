"""benchmarks/bench_gen_knobs.py: the configuration list, the engines' kwargs from rlpost's config, the summary."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_gen_knobs  # noqa: E402

pytestmark = pytest.mark.timeout(120)


def test_configs_put_the_baseline_first_and_merge_joined_names():
    configs = bench_gen_knobs.build_configs(["runner_v2", "runner_v2+tokens_64k"])
    assert list(configs) == ["baseline", "runner_v2", "runner_v2+tokens_64k"]
    assert configs["baseline"] == ()
    assert configs["runner_v2+tokens_64k"] == (*bench_gen_knobs.CANDIDATES["runner_v2"][0],
                                              *bench_gen_knobs.CANDIDATES["tokens_64k"][0])
    with pytest.raises(ValueError, match=r"unknown setting\(s\) \['turbo'\] in 'runner_v2\+turbo'; known: baseline"):
        bench_gen_knobs.build_configs(["runner_v2+turbo"])
    with pytest.raises(ValueError, match="named twice"):
        bench_gen_knobs.build_configs(["async_off", "async_off"])


def test_every_candidate_reaches_the_engine_through_rlpost_config(tmp_path):
    kwargs, env, _ = bench_gen_knobs.rlpost_engine(tmp_path, (), "cuda", 0.12)
    # the GPU example's rollout keys at 512 + 1024, the benchmark's memory share
    assert (kwargs["max_num_batched_tokens"], kwargs["enforce_eager"], kwargs["gpu_memory_utilization"]) == (
        16384, False, 0.12)
    assert kwargs["max_model_len"] == 1536 and kwargs["enable_sleep_mode"] is True and env == {}
    every = "+".join(n for n in bench_gen_knobs.CANDIDATES if n != "baseline")  # one engine with all of them
    kw, env = bench_gen_knobs.rlpost_engine(tmp_path, bench_gen_knobs.build_configs([every])[every], "cuda", 0.12)[:2]
    assert kw["async_scheduling"] is False and env == {"VLLM_USE_V2_MODEL_RUNNER": "1"}
    assert kw["max_num_seqs"] == 512 and kw["max_num_batched_tokens"] == 65536
    assert kw["enable_prefix_caching"] is False
    assert kw["compilation_config"]["cudagraph_capture_sizes"][-1] == 1024
    assert {k for k in kw if kw[k] != kwargs.get(k)} == {"async_scheduling", "max_num_seqs", "max_num_batched_tokens",
                                                       "enable_prefix_caching", "compilation_config"}


def _round(r, **tok_s):
    return {"round": r, **{n: {"s": 1.0, "tok_s": v, "wake_s": 0.1, "sleep_s": 0.05} for n, v in tok_s.items()}}


def test_summary_pairs_each_config_with_the_baseline_round_by_round():
    rounds = [_round(0, baseline=100.0, a=150.0, b=90.0), _round(1, baseline=200.0, a=300.0, b=210.0)]
    summary = bench_gen_knobs.summarize(rounds, ["baseline", "a", "b"])
    a = summary["configs"]["a"]["ratio"]
    assert a["value"] == pytest.approx(1.5) and a["ci_low"] == pytest.approx(1.5)  # a constant ratio: no spread
    assert summary["configs"]["b"]["ratio"]["value"] == pytest.approx((0.9 * 1.05) ** 0.5)
    assert summary["configs"]["baseline"]["tok_s"]["median"] == 150.0
    assert summary["configs"]["a"]["wake_plus_sleep_s"]["median"] == pytest.approx(0.15)
    assert summary["best"] == "a"
    assert bench_gen_knobs.summarize([], ["baseline"]) == {"configs": {}, "best": None}
    assert bench_gen_knobs.summarize(rounds, ["baseline"])["best"] is None


def test_result_goal_a4_is_the_best_ratio_and_notes_short_runs():
    rounds = [_round(r, baseline=100.0 + r, a=160.0 + r) for r in range(3)]
    engines = {"baseline": {"ready": True, "overrides": []}, "a": {"ready": True, "overrides": ["x=1"]},
               "c": {"ready": False, "error": "ValueError: no"}}
    args = bench_gen_knobs.parse_args(["--configs", "baseline"])
    res = bench_gen_knobs.build_result(args, {"engines": engines, "rounds": rounds}, {"gpu": "cpu", "date": "d"})
    goal = res.goals["A4"]
    assert goal["config"] == "a" and goal["overrides"] == ["x=1"]
    assert goal["met"] is None and ">= 12" in goal["reason"]  # 3 rounds: reported, not judged
    full = bench_gen_knobs.build_result(args, {"engines": engines, "rounds": [_round(r, baseline=100.0 + r,
                                                                                     a=160.0 + r) for r in range(12)]},
                                        {"gpu": "cpu", "date": "d"})
    assert full.goals["A4"]["met"] is True and full.goals["A4"]["reps"] == 12
    assert goal["value"] == pytest.approx(res.metrics["a_over_baseline"]["value"]) and "3 rounds" in goal["note"]
    assert set(res.extra["summary"]["configs"]) == {"baseline", "a"}  # the engine that failed to start is left out
    lone = bench_gen_knobs.build_result(args, {"engines": {"baseline": engines["baseline"]}, "rounds": rounds[:1]},
                                        {"gpu": "cpu", "date": "d"})
    assert lone.goals["A4"]["value"] is None and "no configuration" in lone.goals["A4"]["reason"]


def test_budget_stops_a_round_that_would_end_past_it():
    assert bench_gen_knobs.rounds_that_fit(10.0, None, 50.0)
    assert bench_gen_knobs.rounds_that_fit(100.0, 300.0, None)
    assert bench_gen_knobs.rounds_that_fit(250.0, 300.0, 50.0)
    assert not bench_gen_knobs.rounds_that_fit(251.0, 300.0, 50.0)


def test_toy_is_two_configs_two_rounds():
    args = bench_gen_knobs.parse_args(["--toy"])
    assert len(args.configs) == 2 and args.rounds == 2 and args.prompts * args.n == 16
