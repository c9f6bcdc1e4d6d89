"""TASK=vision of scripts/quickstart.sh end to end with 2 SFT steps and 1 GRPO step: every stage runs (the
colour data, the tiny Qwen2-VL model and processor, SFT on the pictures, GRPO with vLLM getting the pictures,
greedy validation before and after of the held-out and the blanked pictures) and the two summary lines close
the console. Learning is measured by the full run (README.md, docs/vision_language.md), too long for CI."""

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
ACCURACY = re.compile(r"^held-out accuracy: before=(\d\.\d\d) after=(\d\.\d\d)$")
BLANKED = re.compile(r"^images blanked: after=(\d\.\d\d)$")


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_quickstart_vision_smoke(tmp_path):
    env = {**os.environ, "TASK": "vision", "QUICKSTART_DIR": str(tmp_path), "QUICKSTART_SKIP_SETUP": "1",
           "SFT_STEPS": "2", "GRPO_STEPS": "1", "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "quickstart.sh")], cwd=ROOT, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=290)
    console = proc.stdout.decode(errors="replace")
    assert proc.returncode == 0, console[-6000:]
    accuracy, blanked = console.strip().splitlines()[-2:]
    assert ACCURACY.match(accuracy), accuracy
    assert BLANKED.match(blanked), blanked
    assert console.count("\n") <= 150, console
    assert (tmp_path / "sft" / "global_step_2" / "preprocessor_config.json").is_file() or \
        (tmp_path / "sft" / "global_step_2" / "processor_config.json").is_file()
    rows = [json.loads(line) for line in (tmp_path / "grpo" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1]
    for row in (rows[0], rows[1]):  # both held-out sets validated, before and after the step
        for source in ("rlpost/colour", "rlpost/colour_blank"):
            assert 0.0 <= row[f"val-core/{source}/reward/mean@1"] <= 1.0, row
    # after 2 SFT steps every sample scores 0 (GRPO advantages 0): the update runs, its gradient may be 0
    assert rows[1]["response_length/mean"] > 0 and math.isfinite(rows[1]["actor/grad_norm"])
