"""The quickstart: its summary helper on hand-written metrics, and a 2-step run of the whole script."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import quickstart_eval  # noqa: E402

METRIC = quickstart_eval.DEFAULT_METRIC
GRPO_STEPS = 10  # of the script's 20: greedy held-out accuracy is already near 1.0 (docs/quickstart.md)
SUMMARY = re.compile(r"^held-out accuracy: before=(\d\.\d\d) after=(\d\.\d\d)$")


def _write(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_before_after_takes_first_and_last_validation(tmp_path):
    _write(tmp_path / "metrics.jsonl", [
        {"step": 0, METRIC: 0.305},
        {"step": 1, "critic/score/mean": 0.2},
        {"step": 20, METRIC: 0.4},
        {"step": 40, METRIC: 0.625, "critic/score/mean": 0.6},
    ])
    assert quickstart_eval.read_validations(tmp_path) == [(0, 0.305), (20, 0.4), (40, 0.625)]
    assert quickstart_eval.before_after(tmp_path) == (0.305, 0.625)
    assert quickstart_eval.summary_line(0.305, 0.625) == "held-out accuracy: before=0.30 after=0.62"


def test_main_prints_one_summary_line(tmp_path, capsys):
    path = _write(tmp_path / "m.jsonl", [{"step": 0, METRIC: 0.25}, {"step": 5, METRIC: 0.5}])
    assert quickstart_eval.main([str(path)]) == 0
    assert capsys.readouterr().out == "held-out accuracy: before=0.25 after=0.50\n"


def test_main_fails_without_two_validations(tmp_path, capsys):
    _write(tmp_path / "metrics.jsonl", [{"step": 0, METRIC: 0.25}, {"step": 1, "other": 1.0}])
    with pytest.raises(ValueError, match="need validations before and after"):
        quickstart_eval.before_after(tmp_path)
    assert quickstart_eval.main([str(tmp_path)]) == 1
    assert "need validations" in capsys.readouterr().err


@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_quickstart_script_learns(tmp_path):
    """The real script with its defaults but half the RL steps: SFT, then GRPO raises greedy held-out accuracy by
    at least 0.20 (the full 20 steps reach 1.00, docs/quickstart.md)."""
    env = dict(os.environ, QUICKSTART_DIR=str(tmp_path), QUICKSTART_SKIP_SETUP="1", GRPO_STEPS=str(GRPO_STEPS),
               PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    # stdout and stderr in one stream, as a terminal shows them; bytes, because text mode would turn the
    # "\r" with which a progress bar redraws its line into a new line
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "quickstart.sh")], cwd=ROOT, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=580)
    console = proc.stdout.decode(errors="replace")
    assert proc.returncode == 0, console[-6000:]
    assert console.count("\n") <= 150, console  # engine and Ray INFO lines go to <run>/logs/
    assert "RotaryEmbedding: Failed to load weights" not in console
    last = console.strip().splitlines()[-1]
    match = SUMMARY.match(last)
    assert match, last
    before, after = (float(x) for x in match.groups())
    assert after - before >= 0.20, last
    assert (tmp_path / "sft" / "global_step_100" / "config.json").is_file()
    steps = [json.loads(line)["step"] for line in (tmp_path / "grpo" / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(GRPO_STEPS + 1))
    assert [s for s, _ in quickstart_eval.read_validations(tmp_path / "grpo")] == [0, GRPO_STEPS]
