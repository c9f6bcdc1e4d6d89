"""benchmarks/bench_gen_alternate.py: the alternating order, the paired ratios and the step against the sum of limits.
The engines run on the GPU host (docs/benchmarks/generation.md); the whole script also runs on CPU with vLLM's CPU build and a
tiny model (`--model-dir <build_tiny_model> --prompts 2 --n 2 --prompt-len 8 --response-len 8 --reps 2`, ~3 min),
too slow for the suite."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import bench_gen_alternate as bga  # noqa: E402

pytestmark = pytest.mark.timeout(60)


def test_the_order_swaps_every_round():
    assert [bga.order(r) for r in range(4)] == [("bare", "rlpost"), ("rlpost", "bare")] * 2


def _round(bare_s: float, gen: float, engine: float, step: float) -> dict:
    return {"bare": {"s": bare_s, "probe_ms": 10.0},
            "rlpost": {"gen": gen, "gen_engine": engine, "gen_wake": 0.1, "gen_sleep": 0.2, "step": step},
            "rlpost_probe_ms": 12.0}


def test_ratios_are_paired_round_by_round():
    # bare 6 / 12 s and rlpost 10 / 8 s: the medians' ratio would be 9 / 9 = 1.0; the rounds' are 0.6 and 1.5
    rounds = [_round(6.0, 10.0, 9.7, 20.0), _round(12.0, 8.0, 7.7, 18.0)]
    s = bga.summarize(rounds)
    assert s["paired_gen_ratio"] == {"median": pytest.approx(1.05), "min": 0.6, "max": 1.5, "n": 2}
    assert s["bare_gen_s"]["median"] == 9.0 and s["rlpost_gen_s"] == {"median": 9.0, "min": 8.0, "max": 10.0, "n": 2}
    assert s["paired_engine_ratio"]["min"] == pytest.approx(6.0 / 9.7)
    assert s["rlpost_wake_plus_sleep_s"]["median"] == pytest.approx(0.3)
    assert "step_over_sum_limits" not in s


def test_the_step_against_limits_uses_the_alternated_bare_generation():
    rounds = [_round(6.0, 10.0, 9.7, 20.0), _round(8.0, 8.0, 7.7, 18.0), _round(7.0, 9.0, 8.7, 19.0)]
    limits = {"fwd": {"s": 1.0}, "train": {"s": 4.0}, "reload_s": 0.5, "gen": {"s": 99.0}}
    s = bga.summarize(rounds, limits)
    assert s["sum_limits_s"] == pytest.approx(7.0 + 2 * 1.0 + 4.0 + 0.5)  # the limits' own gen (99 s) unused
    assert s["step_over_sum_limits"] == pytest.approx(19.0 / 13.5)
    assert s["paired_step_over_sum_limits"]["min"] == pytest.approx(18.0 / 14.5)


def test_the_servers_reply_is_found_among_its_logs():
    out = io.StringIO()
    stream = io.StringIO("INFO vllm: something\n" + bga.TAG + '{"s": 1.5}\nlater\n')
    assert bga.read_reply(stream, out) == {"s": 1.5} and out.getvalue() == "INFO vllm: something\n"
    with pytest.raises(RuntimeError, match="bare engine's process ended"):
        bga.read_reply(io.StringIO("Traceback ...\n"), io.StringIO())
