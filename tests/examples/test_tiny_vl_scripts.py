"""verl's Qwen2.5-VL GRPO scripts downscaled to the tiny Qwen2-VL model (examples/vision/run_tiny_qwen2_vl_grpo.sh),
its frozen-tower variant with verl's own `use_remove_padding=True` (the packed path: mrope positions and pixels on
the packed row): 2 GRPO steps through vLLM with a KL loss, finite metrics, the engine's log-probs near the actor's,
validation before and after, and the merged checkpoint loads with its processor, the tower as it started and the
language model trained. (This run also stands for the padded 2-step run test_vision_e2e had; the padded path runs
end to end in tests/examples/test_quickstart_vision.py.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "vision" / "run_tiny_qwen2_vl_grpo.sh"
sys.path.insert(0, str(ROOT / "tests" / "trainer" / "ppo"))  # the shared checks of a 2-step VL run

from test_vision_e2e import _check_merged_checkpoint, check_two_vl_steps  # noqa: E402


@pytest.mark.e2e
@pytest.mark.timeout(400)
def test_frozen_tower_script_runs_two_packed_steps(tmp_path):
    # an untrained model never names a colour: a score that differs between any two responses gives GRPO
    # non-zero advantages, so the update really moves the language model
    reward = tmp_path / "spread_reward.py"
    reward.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                      "    return (sum(map(ord, solution_str)) % 101) / 100\n")
    run_dir = tmp_path / "run"
    env = {**os.environ, "WORK": str(tmp_path), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    proc = subprocess.run(["bash", str(SCRIPT), "freeze_vision", f"custom_reward_function.path={reward}",
                           "actor_rollout_ref.rollout.calculate_log_probs=true", "trainer.logger=[console,file]",
                           "trainer.save_freq=2", f"trainer.default_local_dir={run_dir}"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=380)
    assert "actor_rollout_ref.model.use_remove_padding=True" in SCRIPT.read_text()  # verl's value, kept
    rows = check_two_vl_steps(proc, run_dir)
    assert len([r for r in rows if "val-core/rlpost/colour/reward/mean@1" in r]) == 2, rows
    _check_merged_checkpoint(run_dir / "global_step_2" / "actor", tmp_path / "model", tmp_path / "merged")
