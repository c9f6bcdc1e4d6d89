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


@pytest.mark.timeout(30)
def test_main_prints_tool_call_rate_after_accuracy(tmp_path, capsys):
    tool = quickstart_eval.TOOL_CALL_METRIC
    path = _write(tmp_path / "metrics.jsonl", [
        {"step": 0, METRIC: 0.0, tool: 0.02},
        {"step": 1, "multi_turn/tool_call_frac": 0.5},
        {"step": 20, METRIC: 0.97, tool: 1.0},
    ])
    assert quickstart_eval.main([str(path), "--tool_calls"]) == 0
    assert capsys.readouterr().out == "held-out accuracy: before=0.00 after=0.97\ntool-call rate: before=0.02 after=1.00\n"
    _write(path, [{"step": 0, METRIC: 0.0}, {"step": 20, METRIC: 0.5}])  # a single-turn run has no tool metric
    assert quickstart_eval.main([str(path), "--tool_calls"]) == 1
    assert tool in capsys.readouterr().err


def _run_quickstart(tmp_path: Path, timeout: int, **env: str) -> str:
    """Run scripts/quickstart.sh in `tmp_path` with `env` added; returns the console (stdout + stderr)."""
    env = {**os.environ, "TASK": "times_ten", "QUICKSTART_DIR": str(tmp_path), "QUICKSTART_SKIP_SETUP": "1",
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", **env}
    # stdout and stderr in one stream, as a terminal shows them; bytes, because text mode would turn the
    # "\r" with which a progress bar redraws its line into a new line
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "quickstart.sh")], cwd=ROOT, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)
    console = proc.stdout.decode(errors="replace")
    assert proc.returncode == 0, console[-6000:]
    return console


@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_quickstart_script_learns(tmp_path):
    """The real script with its defaults but half the RL steps: SFT, then GRPO raises greedy held-out accuracy by
    at least 0.20 (the full 20 steps reach 1.00, docs/quickstart.md)."""
    console = _run_quickstart(tmp_path, timeout=580, GRPO_STEPS=str(GRPO_STEPS))
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


TOOL_SUMMARY = re.compile(r"^tool-call rate: before=(\d\.\d\d) after=(\d\.\d\d)$")


@pytest.mark.e2e
@pytest.mark.timeout(240)
def test_quickstart_calculator_smoke(tmp_path):
    """TASK=calculator end to end with 5 SFT steps and 1 GRPO step: every stage runs (tool_agent rollouts
    through vLLM, greedy validation before and after) and the two summary lines close the console. Learning
    is measured by the full run (docs/multiturn.md), too long for CI."""
    console = _run_quickstart(tmp_path, timeout=230, TASK="calculator", SFT_STEPS="5", GRPO_STEPS="1")
    accuracy, tools = console.strip().splitlines()[-2:]
    assert SUMMARY.match(accuracy), accuracy
    assert TOOL_SUMMARY.match(tools), tools
    assert console.count("\n") <= 150, console
    rows = [json.loads(line) for line in (tmp_path / "grpo" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1]
    for row in rows:  # greedy validation through tool_agent, before and after the step
        assert 0.0 <= row[quickstart_eval.TOOL_CALL_METRIC] <= 1.0
        assert row["val-aux/multi_turn/num_turns/mean"] >= 2.0  # the prompt and at least one model turn
    assert rows[1]["multi_turn/tool_call_frac"] >= 0.0 and rows[1]["response_length/mean"] > 0
    sft = tmp_path / "sft" / "global_step_5"
    assert (sft / "config.json").is_file()
    assert (tmp_path / "data" / "corpus.txt").is_file()


PASS_SUMMARY = re.compile(r"^held-out pass rate: before=(\d\.\d\d) after=(\d\.\d\d)$")


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_quickstart_code_smoke(tmp_path):
    """TASK=code end to end with 5 SFT steps and 1 GRPO step: the trainer starts the sandbox, every sampled program
    runs on its hidden tests (reward/sandbox/* logged), greedy validation before and after, and the pass-rate line
    closes the console. Learning is measured by the full run (README, docs/sandbox.md), too long for CI."""
    console = _run_quickstart(tmp_path, timeout=290, TASK="code", SFT_STEPS="5", GRPO_STEPS="1")
    assert PASS_SUMMARY.match(console.strip().splitlines()[-1]), console[-3000:]
    assert "[rlpost] code sandbox: http://127.0.0.1:" in console
    rows = [json.loads(line) for line in (tmp_path / "grpo" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1]
    statuses = sum(rows[1][f"reward/sandbox/{s}_count"] for s in ("wrong_answer", "runtime_error", "no_code",
                                                                     "wall_time", "cpu_time", "memory", "output_limit", "syscall_denied",
                                                                     "sandbox_error", "compile_error", "bad_tests"))
    passed = rows[1]["reward/sandbox/solved"] * 16 * 8  # every one of the 128 samples has one status
    assert round(statuses + passed) == 128
    assert rows[1]["reward/sandbox/sandbox_error_count"] == 0


@pytest.mark.timeout(30)
@pytest.mark.parametrize("env, message", [
    ({"TASK": "sorting"}, "TASK=sorting: not a quickstart task; use TASK=times_ten (the default), TASK=calculator, "
                          "TASK=code, TASK=vision or TASK=distill"),
    ({"TASK": "code", "LORA_RANK": "8"}, "TASK=code: not supported yet with ALGO=grpo LORA_RANK=8"),
    ({"TASK": "calculator", "ALGO": "ppo"}, "TASK=calculator: not supported yet with ALGO=ppo LORA_RANK=0"),
])
def test_quickstart_refuses_before_setup(tmp_path, env, message):
    # no QUICKSTART_SKIP_SETUP: the refusal comes before the environment set-up
    env = dict(os.environ, QUICKSTART_DIR=str(tmp_path), **env)
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "quickstart.sh")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=20)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert not list(tmp_path.iterdir())  # nothing was built
