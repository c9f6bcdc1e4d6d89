"""End to end: `bash examples/agent_server/run_tiny_cpu.sh` trains 2 GRPO steps through main_ppo (2 worker
processes, vLLM CPU) with every row run by the unmodified openai-client agent beside it; the trajectories keep the
model's turns for the loss and the agent's follow-up text out of it, and each step counts the programs' outcomes."""

import json
import os
import subprocess
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
FOLLOW_UP = "Check it. Answer with #### followed by the number."


def test_run_tiny_cpu_trains_two_steps_through_the_openai_client_agent(tmp_path):
    env = {**os.environ, "MODEL_PATH": str(tmp_path / "model"), "DATA_DIR": str(tmp_path / "data"),
           "CKPT_DIR": str(tmp_path / "run")}
    proc = subprocess.run(["bash", str(REPO / "examples/agent_server/run_tiny_cpu.sh"),
                           "trainer.logger=[console,file]", "trainer.val_before_train=false", "trainer.test_freq=-1"],
                          env=env, cwd=REPO, capture_output=True, text=True, timeout=840)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "timing_s/step" in r]
    assert [r["step"] for r in train] == [1, 2]
    for row in train:  # 4 prompts x 2 samples, every program finished and reported its reward
        assert row["multi_turn/program/ok"] == 8.0
        assert row["multi_turn/program/crashed"] + row["multi_turn/program/timeout"] == 0.0
        assert row["multi_turn/num_turns/mean"] == 4.0  # prompt, answer, the agent's follow-up, answer
        assert abs(row["training/rollout_probs_diff_mean"]) < 1e-3  # recorded log-probs are the policy's
    dump = [json.loads(line) for step in (1, 2)
            for line in (tmp_path / "run" / "rollouts" / f"{step}.jsonl").read_text().splitlines()]
    assert len(dump) == 16
    for d in dump:
        assert FOLLOW_UP in d["response"] and FOLLOW_UP not in d["model_text"]
        assert d["score"] in (0.0, 1.0) and d["program_ok"] == 1.0
