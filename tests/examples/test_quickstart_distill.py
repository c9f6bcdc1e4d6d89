"""TASK=distill of the quickstart: its report on hand-written metrics, and its smoke mode (one main_ppo launch)."""

from __future__ import annotations

import json
import math
import os
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


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_quickstart_distill_smoke(tmp_path):
    """DISTILL_SMOKE=1: the stage list with 2 / 1 SFT steps and one main_ppo launch, the distillation run (1 step,
    16 held-out questions). The script passes its arguments to that run: here the teacher goes to a pool of its
    own, so the run also covers top-k distillation from another model's weights across pools."""
    env = {**os.environ, "TASK": "distill", "QUICKSTART_DIR": str(tmp_path), "QUICKSTART_SKIP_SETUP": "1",
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "DISTILL_SMOKE": "1"}
    pool = ["distillation.n_gpus_per_node=1", "distillation.nnodes=1", "ray_init.num_cpus=3"]
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "quickstart.sh"), *pool], cwd=ROOT, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=290)
    console = proc.stdout.decode(errors="replace")
    assert proc.returncode == 0, console[-4000:]
    assert console.strip().splitlines()[-1].endswith("smoke run: the teacher's evaluation, GRPO alone and the "
                                                     "report skipped"), console[-2000:]
    assert (tmp_path / "sft_teacher" / "global_step_2" / "config.json").is_file()
    assert (tmp_path / "sft_student" / "global_step_1" / "config.json").is_file()
    assert not (tmp_path / "teacher_eval").exists() and not (tmp_path / "grpo").exists()
    rows = [json.loads(line) for line in (tmp_path / "distill" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "timing_s/step" in r] == [1]
    assert [r["step"] for r in rows if METRIC in r] == [0, 1]  # validated before and after the step
    first = next(r for r in rows if "timing_s/step" in r)
    # two SFT'd models (2 and 1 steps from one start): their top-16s differ somewhere, the divergence is positive
    assert 0 < first["distillation/topk_overlap"] < 1, first["distillation/topk_overlap"]
    assert first["actor/distillation_loss"] > 0 and math.isfinite(first["actor/distillation_loss"])
    assert 0 < first["distillation/teacher_topk_mass"] <= 1 + 1e-5
    assert math.isfinite(first["distillation/teacher_student_kl"]) and first["timing_s/teacher"] > 0
    assert first["actor/pg_loss"] == pytest.approx(0.0, abs=1e-6)  # no task reward: the teacher is the only signal
