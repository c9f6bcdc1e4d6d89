"""verl's Qwen2.5-VL GRPO scripts downscaled to the tiny Qwen2-VL model (examples/vision/run_tiny_qwen2_vl_grpo.sh):
verl's own `use_remove_padding=True`, not built for VL models yet, stops before Ray naming the key, after every
other verl key of the copy composed and passed its checks."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "vision" / "run_tiny_qwen2_vl_grpo.sh"


def _launch(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "WORK": str(tmp_path), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=290)


@pytest.mark.skip(reason="stale: use_remove_padding for VL models is built now (not refused); the script must run its 2 steps with verl's True")
@pytest.mark.timeout(300)
def test_verls_packed_setting_stops_before_ray_naming_the_key(tmp_path):
    packed = _launch(tmp_path, "base", "actor_rollout_ref.model.use_remove_padding=True")  # verl's own value
    assert packed.returncode == 2, packed.stderr[-3000:]
    last = packed.stderr.strip().splitlines()[-1]
    assert last.startswith("error: not supported yet: actor_rollout_ref.model.use_remove_padding=true"), last
    assert "engine and Ray logs of this run" not in packed.stdout + packed.stderr
