"""Goal T1's driver on CPU (vLLM at TP 2 over gloo): the TP-2 agent loops against TP 1 on the same rows, the
downscaled copy of verl's TP-2 multi-turn script through `main_ppo`, and the goal issue 49's summary derives.

The host's /dev/shm holds the segments an untagged TP-2 CPU engine asks for (what a killed Ray worker leaves
behind): each engine here takes names of its own (`rlpost.rollout.vllm.tag_cpu_shm_names`) and starts anyway."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_multiturn_tp  # noqa: E402

from benchmarks import goals_49, harness  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]


@pytest.fixture
def untagged_shm_leftovers():
    """vLLM's fixed names for an `external_launcher` engine's TP-2 segments, held for the test (created only
    where absent, and only those removed after)."""
    made = []
    for rank in (0, 1):
        path = Path(f"/dev/shm/-tp:0-[0-1]-cpushm_{rank}")
        if not path.exists():
            path.write_bytes(b"\0" * 4096)
            made.append(path)
    yield
    for path in made:
        path.unlink(missing_ok=True)


def test_multiturn_tp2_on_cpu_and_its_goal(tmp_path: Path, untagged_shm_leftovers) -> None:
    out = tmp_path / "session"
    path = bench_multiturn_tp.main(["--device", "cpu", "--engines", "vllm", "--steps", "1", "--rows", "4",
                                    "--part-timeout", "240", "--work-dir", str(tmp_path / "work"),
                                    "--out-dir", str(out)])
    data = json.loads(path.read_text())
    harness.validate(data)
    check, run = data["engines"]["vllm"]["check"], data["engines"]["vllm"]["main_ppo"]
    assert (check["tp2_rc"], check["tp1_rc"], run["rc"]) == (0, 0, 0), data["engines"]
    # the TP-1 run alone on the same rows is the truth: every row's tokens and masks, and its turns, are the same
    assert check["rows"] == 4 and check["rows_identical"] == 4 and check["turns_tp2"] == check["turns_tp1"]
    assert check["tool_turn_rows"] > 0  # the SFT'd model calls the calculator: the turns come at different times
    assert run["steps_done"] == run["steps_asked"] == 1 and data["metrics"]["vllm_steps_done"]["value"] == 1
    assert (out / "t1_main_ppo_vllm_metrics.jsonl").read_text().count("\n") == 1
    t1 = goals_49.derive(out).goals["T1"]
    assert t1["value"] == 1.0 and t1["steps_done_fraction"] == {"vllm": 1.0}
    assert t1["met"] is None and "sglang" in t1["reason"]  # the goal asks for both engines
    assert t1["tp2_against_tp1"]["vllm"]["rows_identical"] == 4
