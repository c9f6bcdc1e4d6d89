"""Issue 49's GPU session on CPU: every command `benchmarks/gpu_session_b.sh --dry-run` prints is accepted by its
benchmark's own argument parser, each device call fits its limit, and `session_summary --goals 49` files every goal
id (from a 4-GPU session's recorded 7B files, and with no result at all)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_async_d2  # noqa: E402
import bench_limits  # noqa: E402
import bench_moe  # noqa: E402
import bench_multiturn_tp  # noqa: E402
import bench_scale  # noqa: E402
import bench_sglang  # noqa: E402
import bench_ulysses  # noqa: E402

from benchmarks import goals_49, harness, session_summary  # noqa: E402

pytestmark = pytest.mark.timeout(60)
REPO = Path(__file__).resolve().parents[2]
PARSERS = {"bench_limits.py": bench_limits.parse_args, "bench_scale.py": bench_scale.parse_args,
           "bench_ulysses.py": bench_ulysses.parse_args, "bench_sglang.py": bench_sglang.parse_args,
           "bench_multiturn_tp.py": bench_multiturn_tp.parse_args, "bench_async_d2.py": bench_async_d2.parse_args,
           "bench_moe.py": bench_moe.parse_args}
RECORDED = REPO / "benchmarks/results/2026-11-28_h200x4/h200x4_7f59280"  # the 7B limits and 4-GPU step of issue 18


def dry_run(tmp_path: Path) -> tuple[Path, dict[str, dict[str, tuple[int, list[str]]]], list[str]]:
    env = {**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable}
    out = subprocess.run(["bash", "benchmarks/gpu_session_b.sh", "--dry-run"], cwd=REPO, env=env, text=True,
                         capture_output=True, check=True).stdout.splitlines()
    session = Path(out[0].removeprefix("session: "))
    calls: dict[str, dict[str, tuple[int, list[str]]]] = {}
    for line in out[1:]:
        if line.startswith("call "):
            current = calls.setdefault(line.split()[1], {})
        elif " (limit " in line:
            head, cmd = line.split(": ", 1)
            name, limit = head.split(" (limit ")
            current[name] = (int(limit.removesuffix(" s)")), shlex.split(cmd))
    return session, calls, out


def test_dry_run_commands_parse_and_calls_fit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # bench_ulysses's parser also checks the host has its 2 GPUs: the 2-GPU host it is printed for
    monkeypatch.setattr(bench_ulysses.torch.cuda, "device_count", lambda: bench_ulysses.WORLD)
    session, calls, out = dry_run(tmp_path)
    assert session.parent == tmp_path / "results" and sorted(calls) == ["b1a", "b1b", "b1c", "d1", "d2a", "d2b", "d2c", "d3",
                                                                       "m1a", "m1b", "t1s", "t1v"]
    parsed = {}
    for call, parts in calls.items():
        assert sum(limit for limit, _ in parts.values()) <= 550, call  # a device call is at most 600 s
        for name, (limit, cmd) in parts.items():
            script = Path(cmd[1]).name
            parsed[name] = PARSERS[script](cmd[2:])  # exits (SystemExit) on an argument the script lacks
            if script == "bench_scale.py":
                assert parsed[name].timeout < limit and parsed[name].json_out.parent == session
            if script == "bench_multiturn_tp.py":  # three runs (TP-2 check, TP-1 check, main_ppo) and the set-up
                assert 3 * parsed[name].part_timeout + 60 <= limit and parsed[name].out_dir == session
    before, after = parsed["b_limits_before"], parsed["b_limits_after"]
    assert vars(before) | {"json_out": None} == vars(after) | {"json_out": None} and before.arch == "7b"
    assert {Path(a.json_out).name for a in (before, after)} == {"limits_7b_before.json", "limits_7b_after.json"}
    four, two = parsed["b_step4"], parsed["b_step2"]
    assert (four.gpus, two.gpus, four.prompts_per_gpu, two.prompts_per_gpu) == ([4], [2], 8, 8)
    assert four.override == two.override  # weak scaling: the same settings at both GPU counts
    real = parsed["b_step4_real"]  # B6 on the long-tailed workload: the 4-GPU run's settings otherwise
    assert (real.workload, four.workload, real.override, real.gpus) == ("realistic", "fixed", four.override, [4])
    assert bench_scale.workload_overrides(real) == ["data.max_prompt_length=192", "data.max_response_length=1024",
                                                   "data.shuffle=false"]
    # one GPU's share of the 4-GPU batch is what the limits time
    assert before.prompts == [four.prompts_per_gpu] and before.response_len == four.response_len
    key = "actor_rollout_ref.actor.fsdp_config.use_no_sync_for_gradient_accumulation"
    assert f"{key}=true" in parsed["nosync_on"].override and f"{key}=false" in parsed["nosync_off"].override
    assert parsed["d1_ulysses"].lengths == [16384, 32768]
    assert parsed["d3_sglang"].modes == ["sglang:bare", "sglang:loop"] and parsed["d3_sglang"].out_dir == session
    # every file goals_49 reads is written by the part it names
    written = {Path(getattr(a, "json_out", None) or "").name: name for name, a in parsed.items()}
    written["sglang.json"] = "d3_sglang"
    written["multiturn_tp.json"] = "t1_vllm"
    written["async_d2.json"] = "d2_sync_hybrid"
    d2 = {c: parsed[f"d2_{c}"] for c in bench_async_d2.CONFIGS}  # one configuration per call, the same work
    assert [a.config for a in d2.values()] == list(bench_async_d2.CONFIGS)
    for a in d2.values():
        assert (a.arch, a.side_gpus, a.prompts, a.n, a.cap, a.steps, a.out_dir) == ("7b", 2, 32, 8, 4096, 6, session)
        assert a.timeout < calls[{"sync_hybrid": "d2a", "one_step_off": "d2b", "fully_async": "d2c"}[a.config]][
            f"d2_{a.config}"][0]
    mem = "actor_rollout_ref.rollout.gpu_memory_utilization="
    assert [[o for o in a.override if not o.startswith(mem)] for a in d2.values()] == [d2["sync_hybrid"].override[:3]] * 3
    assert [o for o in d2["fully_async"].override if o.startswith(mem)] == [mem + "0.8"]
    assert [(parsed[f"t1_{e}"].engines, parsed[f"t1_{e}"].device) for e in ("vllm", "sglang")] == [
        (["vllm"], "cuda"), (["sglang"], "cuda")]
    written["moe.json"] = "m1_off"
    moe = {r: parsed[f"m1_{r}"] for r in goals_49.MOE_REPLAYS}  # one replay setting per call, the same work
    assert [a.replay for a in moe.values()] == list(goals_49.MOE_REPLAYS) and parsed["m_model"].build_only
    for r, a in moe.items():
        assert (a.gpus, a.layers, a.prompts, a.steps, a.out_dir) == (4, 24, 64, 4, session)
        assert a.timeout < calls[{"off": "m1a", "r2": "m1b"}[r]][f"m1_{r}"][0] and not a.build_only
    for fname, call in goals_49.FILES.values():
        assert fname in written and written[fname] in calls[call], fname
    assert [line.split(":")[0] for line in out if ": not built: " in line] == list(goals_49.NOT_BUILT)
    summary = shlex.split(out[-1].removeprefix("summary: "))
    assert summary[1:3] == ["-m", "benchmarks.session_summary"] and summary[summary.index("--goals") + 1] == "49"


def test_summary_holds_every_goal_49_id_without_results(tmp_path: Path) -> None:
    folder = tmp_path / "results" / "2026-12-03_h200x4"
    folder.mkdir(parents=True)
    path = session_summary.main([str(folder), "--goals", "49", "--results", str(tmp_path / "elsewhere"),
                                 "--reason", "D3=no SGLang on the host"])
    goals = json.loads(path.read_text())["goals"]
    assert set(goals) == set(goals_49.GOALS)
    for gid, g in goals.items():
        assert g["value"] is None and g["met"] is None and g["target"] == goals_49.GOALS[gid] and g["reason"]
    assert goals["D3"]["reason"] == "no SGLang on the host"
    assert "moe.json" in goals["M1"]["reason"] and "scale_7b_2gpu.json" in goals["B5"]["reason"]


def test_b_goals_from_the_recorded_7b_session(tmp_path: Path) -> None:
    """The 2026-11-28 7B files (limits once, the 4-GPU step with the reference resident) put into this session's
    names: B1 is the step over the limits' sum, B2 bare over loop generation, B3 the weight sync."""
    raw = json.loads((RECORDED / "host1/limits_7b_share_h200.json").read_text())
    raw["env"] = {**raw["env"], "gpu": raw["env"]["device"]}
    lim_args = bench_limits.parse_args(["--arch", "7b", "--prompts", "8", "--gen-reps", "5"])
    bench_limits.build_result(lim_args, raw).write(path=tmp_path / "limits_7b_before.json")
    rows = json.loads((RECORDED / "host2/scale_7b_4gpu_tp1_refresident_h200.json").read_text())["results"]
    scale_args = bench_scale.parse_args(["--arch", "7b", "--gpus", "4", "--prompts", "32"])
    bench_scale.build_result(scale_args, rows, harness.environment()).write(path=tmp_path / "scale_7b_4gpu.json")
    goals = goals_49.derive(tmp_path).goals
    row, limit = rows[0], raw["per_batch"]["8"]["sum_limits_s"]
    assert goals["B1"]["value"] == pytest.approx(row["s_per_step"] / limit)
    assert goals["B1"]["met"] is False and goals["B1"]["ci_low"] <= goals["B1"]["value"] <= goals["B1"]["ci_high"]
    assert goals["B1"]["limit_note"].startswith("limits ran once")
    assert goals["B2"]["value"] == pytest.approx(raw["per_batch"]["8"]["gen"]["s"] / row["phases_s"]["gen"])
    assert goals["B3"]["value"] == row["phases_s"]["update_weights"] and goals["B3"]["met"] is False
    assert goals["B4_update"]["params"] == pytest.approx(7.6e9, rel=0.01)  # Qwen2.5-7B's 7.62 B
    assert 0 < goals["B4_old_log_prob"]["value"] < 1 and 0 < goals["B4_update"]["value"] < 1
    assert goals["B6"]["value"] == row["tokens_per_s_per_gpu"]
    assert goals["B5"]["value"] is None and "scale_7b_2gpu.json" in goals["B5"]["reason"]
