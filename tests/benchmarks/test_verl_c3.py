"""Goal C3 on CPU: verl's FLOPs formula by hand, the per-sample caps patch for verl's rollout (hook and rule), the
session script's commands, and the summary (token check, C3, MFU) from parser fixtures.

The log lines below are PARSER FIXTURES written in the two trainers' log formats (verl 0.9.1's file logger and
console logger, rlpost's metrics file), with made-up numbers: they test the parsing and the arithmetic, they are
not results."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import shlex
import subprocess
import sys
import types
from pathlib import Path

import pytest

from benchmarks import bench_limits, session_summary, verl_c3, verl_side, workload

pytestmark = pytest.mark.timeout(60)
REPO = Path(__file__).resolve().parents[2]
_SPEC = importlib.util.spec_from_file_location("verl_caps_site", REPO / "benchmarks/verl_caps/sitecustomize.py")
verl_caps = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(verl_caps)  # by path: this interpreter may hold a sitecustomize of its own


def test_flops_formula_by_hand() -> None:
    # hidden 8, intermediate 16, 2 heads of 4, 1 kv head, 1 layer, vocab 10:
    # mlp 3*8*16 = 384, attention linears 8*(8+4+4+8) = 192, embedding + head 2*10*8 = 160 -> dense 736
    cfg = dict(hidden_size=8, intermediate_size=16, num_attention_heads=2, num_key_value_heads=1,
               num_hidden_layers=1, vocab_size=10)
    assert verl_c3.dense_params(cfg) == 736
    # 6*736*(3+5) = 35328, attention 6*(9+25)*4*2*1 = 1632
    assert verl_c3.train_flops(cfg, [3, 5]) == 36960
    assert verl_c3.mfu(cfg, [3, 5], seconds=2.0, peak=36960.0) == 0.5
    # the 0.5B architecture: 24 layers of 3*896*4864 + 896*(896+128+128+896), plus 2*151936*896
    assert verl_c3.dense_params(bench_limits.QWEN05) == 24 * (3 * 896 * 4864 + 896 * 2048) + 2 * 151936 * 896


def test_caps_rule_and_patch() -> None:
    assert verl_caps.sample_cap({"response_caps": [100, 7, 2000]}, 4, 1024) == 7  # j % len
    assert verl_caps.sample_cap({"response_caps": [100, 7, 2000]}, 2, 1024) == 1024  # at most the global cap
    assert verl_caps.sample_cap({}, 0, 1024) is None and verl_caps.sample_cap(None, 0, 1024) is None

    seen = []

    class AgentLoopWorker:  # verl 0.9.1's signature: (sampling_params, trajectory, *, agent_name, trace, **kwargs)
        config = types.SimpleNamespace(actor_rollout_ref=types.SimpleNamespace(
            rollout=types.SimpleNamespace(response_length=1024)))

        async def _run_agent_loop(self, sampling_params, trajectory, *, agent_name, trace=True, **kwargs):
            seen.append((sampling_params.get("max_tokens"), agent_name, kwargs.get("session_id")))

    module = types.SimpleNamespace(AgentLoopWorker=AgentLoopWorker)
    verl_caps.patch(module)
    verl_caps.patch(module)  # once only
    w, info = AgentLoopWorker(), {"response_caps": [30, 40]}
    for j in range(3):  # the v1 trainer: one call per session of the prompt
        asyncio.run(w._run_agent_loop({"temperature": 1.0}, trajectory={"validate": False, "rollout_n": 0},
                                      agent_name="single_turn_agent", session_id=j, extra_info=info))
    asyncio.run(w._run_agent_loop({}, {"validate": False, "rollout_n": 1}, agent_name="a", extra_info=info))
    asyncio.run(w._run_agent_loop({}, {"validate": True, "rollout_n": 0}, agent_name="a", extra_info=info))
    assert [s[0] for s in seen] == [30, 40, 30, 40, None]  # legacy trainer: rollout_n; validation left alone


def test_hook_patches_at_import_in_a_fresh_process(tmp_path: Path) -> None:
    """sitecustomize on PYTHONPATH: the agent-loop module (here a stand-in package named like verl's) comes back
    patched in a new interpreter, and the process prints the mark the summary counts."""
    pkg = tmp_path / "verl" / "experimental" / "agent_loop"
    pkg.mkdir(parents=True)
    for d in (tmp_path / "verl", tmp_path / "verl" / "experimental", pkg):
        (d / "__init__.py").write_text("")
    (pkg / "agent_loop.py").write_text("class AgentLoopWorker:\n    async def _run_agent_loop(self, sp, traj, **kw):"
                                       "\n        return sp\n")
    host = tmp_path / "host_site"  # a start-up hook the host had: still run, after ours
    host.mkdir()
    (host / "sitecustomize.py").write_text("import os\nos.environ['HOST_HOOK_RAN'] = '1'\n")
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'benchmarks' / 'verl_caps'}:{tmp_path}:{host}"}
    code = ("import os, verl.experimental.agent_loop.agent_loop as m; "
            "print(m.AgentLoopWorker._run_agent_loop._verl_caps, os.environ.get('HOST_HOOK_RAN'))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=30)
    assert out.stdout.strip() == "True 1", out.stderr
    assert verl_c3.caps_patched(out.stderr) == 1


def test_session_script_commands_parse_and_fit(tmp_path: Path) -> None:
    env = {**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable}
    lines = subprocess.run(["bash", "benchmarks/gpu_session_c3.sh", "--dry-run"], cwd=REPO, env=env, text=True,
                           capture_output=True, check=True, timeout=30).stdout.splitlines()
    session = Path(lines[0].removeprefix("session: "))
    cmds, limits = {}, {}
    for line in lines[1:]:
        head, cmd = line.split(": ", 1)
        name, _, limit = head.partition(" (limit ")
        cmds[name] = shlex.split(cmd)
        if limit:
            limits[name] = int(limit.removesuffix(" s)"))
    assert sum(limits.values()) + 40 <= 590  # one device call (600 s) with the model build and the summaries
    rl = verl_c3.parse_args(cmds["rlpost"][3:])
    vr = verl_side.parse_args(cmds["verl"][3:])
    c3 = verl_c3.parse_args(cmds["c3"][3:])
    assert rl.what == "rlpost" and vr.what == "run" and c3.what == "summary"
    assert rl.timeout < limits["rlpost"] and vr.timeout < limits["verl"]
    for key in ("model_dir", "data", "session", "steps", "prompts", "n", "cap", "seed", "prompt_len"):
        assert getattr(rl, key) == getattr(vr, key) == getattr(c3, key), key  # the same work on both sides
    assert rl.session == session and (rl.prompts, rl.n, rl.steps) == (64, 8, 5)
    data = cmds["data"]
    assert data[data.index("--out") + 1] == str(rl.data) and data[data.index("--steps") + 1] == "5"
    verl_cmd = verl_side.verl_command(vr.model_dir, vr.data, vr.steps, vr.prompt_len, vr.cap, vr.prompts, vr.n)
    rlpost_cmd = verl_c3.rlpost_command(rl.data, Path("/r"), rl.steps, rl.prompts, rl.prompt_len, rl.cap)
    assert "actor_rollout_ref.rollout.ignore_eos=True" in verl_cmd
    assert "actor_rollout_ref.rollout.ignore_eos=true" in rlpost_cmd
    for cmd in (verl_cmd, rlpost_cmd):
        assert any(c.lower() == "data.shuffle=false" for c in cmd) and "data.train_batch_size=64" in cmd
    assert "actor_rollout_ref.ref.fsdp_config.param_offload=True" in verl_cmd  # the example's settings
    assert Path(rlpost_cmd[1]).name == "run_qwen2_5_0_5b_gpu.sh"
    summary = cmds["summary"]
    assert summary[1:3] == ["-m", "benchmarks.session_summary"] and Path(summary[3]) == session


# PARSER FIXTURES: the shapes of the two logs, made-up values (not results).
def _fixture_rows(expected, scale_verl_response: float = 1.0):
    verl_file, verl_console, rlpost = [], [], []
    for e in expected:
        r = sum(e["response_tokens"]) / len(e["response_tokens"])
        p = sum(e["prompt_tokens"]) / len(e["prompt_tokens"])
        vstep, rstep = 20.0 + e["step"], 8.0 + 0.5 * e["step"]
        data = {"timing_s/step": vstep, "timing_s/update_actor": 6.0, "timing_s/gen": 9.0,
                "response_length/mean": r * scale_verl_response, "prompt_length/mean": p, "perf/mfu/actor": 0.07}
        verl_file.append(json.dumps({"step": e["step"], "data": data}))
        verl_console.append("(TaskRunnerV1 pid=4242) step:%d - " % e["step"]
                            + " - ".join(f"{k}:{v!r}" for k, v in data.items()))
        rlpost.append(json.dumps({"step": e["step"], "timing_s/step": rstep, "timing_s/update_actor": 2.0,
                                  "response_length/mean": r * 0.998, "prompt_length/mean": p}))
    return verl_file, verl_console, rlpost


def test_summary_from_parser_fixtures(tiny_model_dir: str, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    wl = workload.gsm8k_shaped(4 * 3, 2, cap=64, seed=0)  # 3 steps of 4 prompts x 2
    workload.write_parquet(wl, tok, tmp_path / "data" / "train.parquet")
    expected = verl_c3.expected_steps(tmp_path / "data", tok, prompts=4, n=2, steps=3, cap=64)
    assert [e["response_tokens"] for e in expected] == [wl.step(k, 4).caps.reshape(-1).tolist() for k in range(3)]
    verl_file, verl_console, rlpost = _fixture_rows(expected)
    s = tmp_path / "session"
    s.mkdir()
    (s / "verl_metrics.jsonl").write_text("\n".join(verl_file) + "\n")
    (s / "verl_stdout.log").write_text("\n".join(["(AgentLoopWorkerTQ pid=7) [verl_caps] per-sample response caps "
                                                  "on AgentLoopWorker._run_agent_loop (pid 7)", *verl_console]))
    (s / "rlpost_metrics.jsonl").write_text("\n".join(rlpost) + "\n")
    from_file = verl_c3.verl_rows(s / "verl_metrics.jsonl")
    from_console = verl_c3.verl_rows(None, s / "verl_stdout.log")
    assert from_file == from_console and [r["step"] for r in from_file] == [1, 2, 3]

    cfg = json.loads((Path(tiny_model_dir) / "config.json").read_text())
    res = verl_c3.summarise(verl_c3.rlpost_rows(s / "rlpost_metrics.jsonl"), from_file, expected, cfg,
                            verl_c3.caps_patched((s / "verl_stdout.log").read_text()), "fixture")
    g = res.goals["C3"]
    # rlpost steps 2,3: 9.0, 9.5 (median 9.25); verl 22, 23 (median 22.5)
    assert g["value"] == pytest.approx(9.25 / 22.5) and g["met"] is True and g["reps"] == 2
    assert (g["ci_low"], g["ci_high"]) == (pytest.approx(9.0 / 23), pytest.approx(9.5 / 22))
    assert res.extra["token_check"]["same_work"] is True
    seqlens = [p + r for p, r in zip(expected[1]["prompt_tokens"], expected[1]["response_tokens"])]
    assert res.metrics["rlpost_actor_mfu"]["values"][0] == pytest.approx(verl_c3.mfu(cfg, seqlens, 2.0))
    assert res.metrics["verl_actor_mfu_own"]["value"] == pytest.approx(0.07)
    path = res.write(session=s)
    assert path.name == "verl_c3.json"

    # session_summary files C3 from that result, beside the other goal ids (not measured here)
    out = session_summary.main([str(s), "--results", str(tmp_path), "--page", str(tmp_path / "current.md")])
    goals = json.loads(out.read_text())["goals"]
    assert goals["C3"]["value"] == pytest.approx(g["value"]) and goals["C3"]["benchmark"] == "verl_c3"
    assert goals["A1"]["value"] is None

    # verl's responses 5 % longer than the file's caps: not the same work, so C3 is not judged
    verl_file, _, _ = _fixture_rows(expected, scale_verl_response=1.05)
    bad = verl_c3.summarise(verl_c3.rlpost_rows(s / "rlpost_metrics.jsonl"),
                            [{"step": json.loads(x)["step"], **json.loads(x)["data"]} for x in verl_file],
                            expected, cfg, 1, "fixture")
    assert bad.extra["token_check"]["same_work"] is False and bad.goals["C3"]["met"] is None
    no_caps = verl_c3.summarise(verl_c3.rlpost_rows(s / "rlpost_metrics.jsonl"), from_file, expected, cfg, 0, "x")
    assert no_caps.goals["C3"]["met"] is None  # verl ran without the caps patch
    empty = verl_c3.summarise([], from_file, expected, cfg, 1, "x")
    assert empty.goals["C3"]["value"] is None and "rlpost" in empty.goals["C3"]["reason"]
    # verl cut short after its first step: C3 is not measured, the warm-up steps' ratio is kept beside it
    one = verl_c3.summarise(verl_c3.rlpost_rows(s / "rlpost_metrics.jsonl"), from_file[:1], expected, cfg, 1, "x")
    assert one.goals["C3"]["value"] is None and "verl" in one.goals["C3"]["reason"]
    assert one.metrics["step1_rlpost_over_verl"]["value"] == pytest.approx(8.5 / 21.0)  # 8 + 0.5 against 20 + 1


def test_rlpost_side_command_passes_rlpost_dry_run(tiny_model_dir: str, tmp_path: Path) -> None:
    """rlpost's run (its GPU example with the workload's overrides) is accepted by rlpost's own config check."""
    from transformers import AutoTokenizer

    wl = workload.gsm8k_shaped(2, 8, cap=1024, seed=0)  # the dry run checks the settings, not the rows
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    for name in ("train", "val"):
        workload.write_parquet(wl, tok, tmp_path / "data" / f"{name}.parquet")
    cmd = verl_c3.rlpost_command(tmp_path / "data", tmp_path / "run", 5, 64, 192, 1024) + ["trainer.dry_run=true"]
    env = {**os.environ, "MODEL_PATH": tiny_model_dir, "DATA_DIR": str(tmp_path / "data"), "N_GPUS": "1",
           "PYTHONPATH": str(REPO)}
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=50)
    assert out.returncode == 0, (out.stdout + out.stderr)[-2000:]
    assert "per step: 64 prompts -> 512 responses" in out.stdout and "total training steps: 5" in out.stdout
    assert "1 mini-batches per step" in out.stdout  # one optimizer step a step, as verl's ppo_mini_batch_size=64
