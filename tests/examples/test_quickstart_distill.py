"""TASK=distill of the quickstart: its report on hand-written metrics, and a 1-step run of the whole stage list."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import quickstart_distill_report as report  # noqa: E402

METRIC = report.DEFAULT_METRIC


def _run(path: Path, values: dict[int, float]) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"step": s, METRIC: v, "timing_s/step": 1.0}) for s, v in values.items()]
    (path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.timeout(30)
def test_report_names_the_first_step_at_the_target_or_the_last_one(tmp_path, capsys):
    teacher = _run(tmp_path / "t", {0: 0.9})
    distill = _run(tmp_path / "d", {0: 0.1, 2: 0.5, 4: 0.75, 6: 0.9})
    grpo = _run(tmp_path / "g", {0: 0.1, 2: 0.2, 4: 0.3, 6: 0.4})
    assert report.main(["--teacher", str(teacher), "--distill", str(distill), "--grpo", str(grpo),
                        "--plot", str(tmp_path / "p.png")]) == 0
    out = capsys.readouterr().out.splitlines()
    # target 0.8 x 0.9 = 0.72: distillation reaches it at step 4, GRPO never (its last validation, step 6)
    assert out[-3:] == ["teacher: 0.90", "student after distillation: 0.75 (step 4)",
                        "student after GRPO alone: 0.40 (step 6), below 0.72"]
    assert (tmp_path / "p.png").stat().st_size > 1000


@pytest.mark.timeout(30)
def test_report_fails_on_a_run_without_validations(tmp_path, capsys):
    empty = tmp_path / "e"
    empty.mkdir()
    (empty / "metrics.jsonl").write_text(json.dumps({"step": 1, "timing_s/step": 1.0}) + "\n")
    run = _run(tmp_path / "r", {0: 0.5})
    assert report.main(["--teacher", str(run), "--distill", str(empty), "--grpo", str(run)]) == 1
    assert "no validation of" in capsys.readouterr().err


@pytest.mark.skip(reason="over the CI budget (3 main_ppo launches, 391 s under load): to be cut to one launch")
@pytest.mark.e2e
@pytest.mark.timeout(400)
def test_quickstart_distill_smoke(tmp_path):
    """Every stage with 2 / 1 SFT steps, 1 RL step and 16 held-out questions: the teacher's evaluation, the
    distillation run (the teacher scored the student's samples), GRPO alone, the closing lines and the plot."""
    env = {**os.environ, "TASK": "distill", "QUICKSTART_DIR": str(tmp_path), "QUICKSTART_SKIP_SETUP": "1",
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "SFT_STEPS": "2",
           "DISTILL_STUDENT_SFT_STEPS": "1", "DISTILL_STEPS": "1", "DISTILL_VAL_FREQ": "1", "DISTILL_TEST_SIZE": "16"}
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "quickstart.sh")], cwd=ROOT, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=390)
    console = proc.stdout.decode(errors="replace")
    assert proc.returncode == 0, console[-4000:]
    last = console.strip().splitlines()[-3:]
    assert re.fullmatch(r"teacher: \d\.\d\d", last[0]), last
    assert re.fullmatch(r"student after distillation: \d\.\d\d \(step [01]\)(, below \d\.\d\d)?", last[1]), last
    assert re.fullmatch(r"student after GRPO alone: \d\.\d\d \(step [01]\)(, below \d\.\d\d)?", last[2]), last
    assert (tmp_path / "distill_vs_grpo.png").stat().st_size > 1000
    steps = [json.loads(line) for line in (tmp_path / "distill" / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in steps if "timing_s/step" in r]
    assert [r["step"] for r in trained] == [1]
    assert math.isfinite(trained[0]["distillation/teacher_student_kl"]) and trained[0]["timing_s/teacher"] > 0
    grpo = [json.loads(line) for line in (tmp_path / "grpo" / "metrics.jsonl").read_text().splitlines()]
    assert not any("distillation/teacher_student_kl" in r for r in grpo)
