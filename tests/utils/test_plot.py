"""Plots: metrics.jsonl written by the file logger -> valid, non-empty PNG files."""

import json
import math

import pytest

from rlpost.utils.plot import load_metrics, main, plot_run, series
from rlpost.utils.tracking import METRICS_FILE, Tracking

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _write_run(run_dir, steps: int = 6) -> None:
    tracker = Tracking("p", "e", [], log_dir=run_dir)
    for step in range(1, steps + 1):
        metrics = {
            "critic/score/mean": step / steps,
            "actor/pg_loss": -0.01 * step,
            "actor/ppo_kl": 0.001 * step,
            "actor/entropy": 2.0 - 0.1 * step if step != 3 else float("nan"),
            "response_length/mean": 10.0 + step,
            "timing_s/gen": 1.0,
            "timing_s/update_actor": 0.5,
            "timing_s/step": 1.6,
        }
        if step % 3 == 0:
            metrics["val-core/gsm8k/acc/mean@1"] = 0.1 * step
        tracker.log(metrics, step)
    tracker.finish()


def test_load_metrics_last_line_wins_and_nan(tmp_path):
    _write_run(tmp_path, steps=3)
    with open(tmp_path / METRICS_FILE, "a") as f:
        f.write(json.dumps({"step": 2, "critic/score/mean": 9.0}) + "\n")  # resumed run re-logs step 2
        f.write('{"step": 4, "critic/sc')  # cut short by a crash
    records = load_metrics(tmp_path)
    assert [r["step"] for r in records] == [1, 2, 3]
    assert series(records, "critic/score/mean") == ([1, 2, 3], [1 / 3, 9.0, 1.0])
    steps, values = series(records, "actor/entropy")
    assert steps == [1, 3] and math.isnan(values[1])


def test_plot_run_writes_valid_pngs(tmp_path):
    _write_run(tmp_path)
    files = plot_run(tmp_path)
    names = sorted(p.name for p in files)
    assert names == sorted(
        ["score.png", "loss.png", "kl.png", "entropy.png", "response_length.png", "timing.png", "val_core.png"]
    )
    for path in files:
        assert path.parent == tmp_path / "plots"
        data = path.read_bytes()
        assert data[:8] == PNG_MAGIC and len(data) > 5000


def test_cli_metrics_file_and_out_dir(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    lines = [{"step": s, "actor/ppo_kl": 0.1 * s, "timing_s/gen": 1.0, "timing_s/step": 1.5} for s in (1, 2)]
    (run / METRICS_FILE).write_text("".join(json.dumps(x) + "\n" for x in lines))
    out = tmp_path / "figs"
    assert main([str(run / METRICS_FILE), "--out_dir", str(out)]) == 0
    printed = capsys.readouterr().out.split()
    assert str(out / "timing.png") in printed
    assert (out / "kl.png").read_bytes()[:8] == PNG_MAGIC


def test_only_present_curves_and_empty_file(tmp_path):
    (tmp_path / METRICS_FILE).write_text(json.dumps({"step": 1, "actor/entropy": 1.0}) + "\n")
    assert [p.name for p in plot_run(tmp_path)] == ["entropy.png"]
    (tmp_path / METRICS_FILE).write_text("")
    with pytest.raises(ValueError, match="no metric records"):
        plot_run(tmp_path)
