"""The benchmark harness: statistics against hand-computed numbers, the alternation order, the result schema."""

from __future__ import annotations

import json
import math

import pytest

from benchmarks import current_numbers, harness


def test_t_quantiles_match_the_table() -> None:
    assert harness.t975(1) == 12.706
    assert harness.t975(11) == 2.201
    # Tables: t(0.975; 40) = 2.021, t(0.975; 120) = 1.980.
    assert harness.t975(40) == pytest.approx(2.021, abs=1e-3)
    assert harness.t975(120) == pytest.approx(1.980, abs=1e-3)
    with pytest.raises(ValueError, match="df must be >= 1"):
        harness.t975(0)


def test_geometric_mean_and_interval_by_hand() -> None:
    # ln 2 and ln 8: mean 2 ln 2 (geomean 4), sd = sqrt(2) ln 2, half width = 12.706 * ln 2 for n = 2.
    got = harness.paired_ratio([2.0, 16.0], [1.0, 2.0])
    assert got["value"] == pytest.approx(4.0)
    assert got["ci_low"] == pytest.approx(4.0 * 2 ** -12.706)
    assert got["ci_high"] == pytest.approx(4.0 * 2 ** 12.706)
    assert got["values"] == [2.0, 8.0] and got["n"] == 2
    same = harness.geomean_ci([0.9] * 6)
    assert same["value"] == pytest.approx(0.9) and same["ci_low"] == pytest.approx(0.9)
    # Three ratios e^-0.1, 1, e^0.1: mean 0, sd 0.1, half width 4.303 * 0.1 / sqrt(3).
    three = harness.geomean_ci([math.exp(-0.1), 1.0, math.exp(0.1)])
    assert three["ci_high"] == pytest.approx(math.exp(4.303 * 0.1 / math.sqrt(3)))
    assert harness.geomean_ci([1.5])["ci_low"] is None
    with pytest.raises(ValueError, match="positive finite"):
        harness.geomean_ci([1.0, 0.0])
    with pytest.raises(ValueError, match="2 numerators against 1"):
        harness.paired_ratio([1.0, 2.0], [1.0])


def test_alternate_swaps_the_order_each_round() -> None:
    calls: list[str] = []
    times = iter([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])

    def side(name: str):
        def run() -> float:
            calls.append(name)
            return next(times)
        return run

    seen = []
    rounds = harness.alternate({"a": side("a"), "b": side("b")}, rounds=3, on_round=seen.append)
    assert calls == ["a", "b", "b", "a", "a", "b"]
    assert [r["order"] for r in rounds] == [["a", "b"], ["b", "a"], ["a", "b"]]
    assert [(r["a"]["s"], r["b"]["s"]) for r in rounds] == [(1.0, 2.0), (4.0, 3.0), (5.0, 6.0)]
    assert all(r["a"]["probe_ms"] > 0 for r in rounds) and len(seen) == 3
    with pytest.raises(ValueError, match="without 's'"):
        harness.alternate({"x": lambda: {"t": 1.0}}, rounds=1, probe=False)


def test_spread_and_limit_pair_void_rule() -> None:
    s = harness.spread([5.0, 1.0, 3.0, 2.0, 4.0])
    assert (s["median"], s["q1"], s["q3"], s["min"], s["max"], s["n"]) == (3.0, 2.0, 4.0, 1.0, 5.0, 5)
    assert harness.spread([])["median"] is None
    ok = harness.limit_pair([1.0, 1.2, 1.0], [1.04])
    assert ok["before"] == 1.0 and ok["after"] == 1.04 and ok["value"] == pytest.approx(1.02)
    assert ok["drift"] == pytest.approx(0.04) and not ok["void"]
    bad = harness.limit_pair([1.06], [1.0])
    assert bad["drift"] == pytest.approx(0.06) and bad["void"]


def test_met_reads_every_clause() -> None:
    assert harness.met(">= 0.95", 0.96) is True
    assert harness.met(">= 0.95, ci_low >= 0.90", 0.96, 0.89, 1.0) is False
    assert harness.met(">= 0.95, ci_low >= 0.90", 0.96, 0.91, 1.0) is True
    assert harness.met("<= 1.15", 1.2) is False
    assert harness.met(">= 0.95", None) is None
    assert harness.met("ci_low >= 0.9", 1.0, None) is False
    with pytest.raises(ValueError, match="cannot read the target clause 'about 1'"):
        harness.met("about 1", 1.0)


def test_environment_and_slug(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLPOST_COMMIT", "abc1234")
    monkeypatch.setenv("RLPOST_DIRTY", "1")
    env = harness.environment()
    assert env["commit"] == "abc1234" and env["dirty"] is True
    for key in ("date", "host", "cpu", "gpu", "torch", "vllm", "transformers", "cpu_probe_ms"):
        assert key in env
    assert env["cpu_probe_ms"] > 0 and env["gpu"] == "cpu"  # CI has no GPU
    assert harness.slug("NVIDIA H200") == "h200" and harness.slug("NVIDIA H100 80GB HBM3") == "h100"
    assert harness.slug(None) == "cpu"


def _env(date: str, gpu: str = "NVIDIA H200") -> dict:
    return {"commit": "c0ffee1", "dirty": False, "date": date, "host": "h", "gpu": gpu}


def test_result_summary_index_and_current_page(tmp_path) -> None:
    res = harness.Result("gen_alternate", command="python -m benchmarks.x", reps=12,
                         env=_env("2026-12-02T05:00:00+00:00"))
    ratio = harness.paired_ratio([1.0] * 12, [1.0] * 12)
    res.metric("gen_ratio", **{k: ratio[k] for k in ("value", "ci_low", "ci_high", "values")}, unit="x")
    res.goal("A3", ratio, target=">= 0.95, ci_low >= 0.90")
    path = res.write(root=tmp_path)
    assert path == tmp_path / "2026-12-02_h200" / "gen_alternate.json"
    data = json.loads(path.read_text())
    assert data["schema"] == harness.SCHEMA and data["commit"] == "c0ffee1" and data["reps"] == 12
    assert data["metrics"]["gen_ratio"]["values"] == [1.0] * 12
    assert data["goals"]["A3"]["met"] is True and data["goals"]["A3"]["command"] == "python -m benchmarks.x"
    (path.parent / "old_shape.json").write_text("{\"env\": {}}")  # a legacy file: listed, not summarized
    summary = json.loads(harness.write_summary(path.parent, {"A3": ">= 0.95", "C3": "<= 0.5"},
                                               {"C3": "verl did not start"}).read_text())
    assert summary["files"] == ["gen_alternate.json"]
    assert summary["goals"]["A3"]["value"] == pytest.approx(1.0)
    assert summary["goals"]["C3"] == {**harness.not_measured("<= 0.5", "verl did not start")}
    older = harness.Result("x", command="c", reps=1, env=_env("2026-11-30T00:00:00+00:00"))
    older.goal("A3", {"value": 0.5}, target=">= 0.95")
    harness.write_summary(older.write(root=tmp_path).parent)
    index = harness.write_index(tmp_path).read_text()
    assert index.index("## 2026-12-02_h200") < index.index("## 2026-11-30_h200")
    assert "- [old_shape.json](2026-12-02_h200/old_shape.json)" in index
    assert "gen_alternate, commit c0ffee1, 12 reps; goals A3=1" in index
    page = current_numbers.render(tmp_path)
    assert "session `2026-12-02_h200`" in page and "2026-11-30" not in page  # A3's newer value wins
    assert "| C3 | – | – | <= 0.5 | not measured | 0 | 2026-12-02_h200 | verl did not start |" in page
    assert "| A3 | 1 | 1–1 | >= 0.95, ci_low >= 0.90 | yes | 12 | 2026-12-02_h200 |" in page
    newer = harness.Result("y", command="e1", reps=5, env=_env("2026-12-03T00:00:00+00:00"))
    newer.goal("E1", {"value": 1.0, "ci_low": 0.9, "ci_high": 1.1}, target=">= 0.90")
    harness.write_summary(newer.write(root=tmp_path).parent, {"A3": ">= 0.95", "E1": ">= 0.90"})
    page = current_numbers.render(tmp_path)  # a session that ran only E1 keeps A3 from the one before
    assert "| E1 | 1 | 0.9–1.1 | >= 0.90 | yes | 5 | 2026-12-03_h200 |" in page
    assert "| A3 | 1 | 1–1 | >= 0.95, ci_low >= 0.90 | yes | 12 | 2026-12-02_h200 |" in page
    assert "session `2026-12-03_h200`" in page and "session `2026-12-02_h200`" in page
    with pytest.raises(ValueError, match="no rlpost-bench/1 result file"):
        harness.write_summary(tmp_path / "2026-11-30_h200" / "..", None)


def test_timing_metric_and_the_validator(tmp_path) -> None:
    res = harness.Result("t", command="c", reps=4, env=_env("2026-12-02T05:00:00+00:00"))
    m = res.timing("step_s", [4.0, 1.0, 3.0, 2.0], note="n")
    # Inclusive quartiles of 1, 2, 3, 4: 1.75 and 3.25; the median 2.5.
    assert m["value"] == 2.5 and m["spread"]["q1"] == 1.75 and m["spread"]["q3"] == 3.25
    assert (m["spread"]["min"], m["spread"]["max"], m["values"], m["unit"], m["note"]) == (1.0, 4.0,
                                                                                        [4.0, 1.0, 3.0, 2.0], "s", "n")
    out = tmp_path / "deep" / "named.json"
    assert res.write(path=out) == out
    harness.validate(json.loads(out.read_text()))
    good = res.to_dict()
    for broken, message in ((dict(good, schema="other/1"), "schema 'other/1'"),
                            ({k: v for k, v in good.items() if k != "gpu"}, "missing key 'gpu'"),
                            (dict(good, reps=True), "reps=True is not int"),
                            (dict(good, metrics={"x": {"value": 1.0}}), "metric 'x' lacks")):
        with pytest.raises(ValueError, match=message):
            harness.validate(broken)
    with pytest.raises(ValueError, match="command=None is not str"):
        harness.Result("t", command=None, reps=1, env=_env("2026-12-02T05:00:00+00:00")).write(path=out)


@pytest.mark.timeout(10)
def test_goal_counts_the_rounds_behind_the_figure_and_holds_the_protocol_minimum() -> None:
    res = harness.Result("realistic", "cmd", 12, env={"date": "2026-12-03", "gpu": "NVIDIA H200"})
    four = harness.geomean_ci([1.0, 0.98, 0.97, 0.99])  # a run asked for 12 rounds, cut short after 4
    res.goal("A3", four, ">= 0.95, ci_low >= 0.90")
    assert res.goals["A3"]["reps"] == 4 and res.goals["A3"]["met"] is None and ">= 12" in res.goals["A3"]["reason"]
    res.goal("A1", four, ">= 0.30")  # a training figure needs 5: not judged either, though its value misses
    assert res.goals["A1"]["met"] is None
    res.goal("A2", harness.geomean_ci([0.36] * 5), ">= 0.35")
    assert res.goals["A2"]["reps"] == 5 and res.goals["A2"]["met"] is True and "reason" not in res.goals["A2"]
