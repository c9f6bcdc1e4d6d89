"""bench_phase_gap's logic on CPU (its GPU run is in docs/benchmarks/realistic.md): the rollout-shaped rows hold the
workload's lengths, `--pick` chooses the fastest finished variant and maps its settings onto the critic, and every
command of `benchmarks/gpu_session_g.sh --dry-run` (which runs those settings) is accepted by its benchmark's parser."""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import bench_phase_gap, workload

pytestmark = pytest.mark.timeout(60)
REPO = Path(__file__).resolve().parents[2]


def test_batch_rows_hold_the_workload():
    args = argparse.Namespace(prompts=3, n=2, cap=64, seed=0, prompt_len=192)
    batch, seqs = bench_phase_gap.batch_rows(args, vocab=500)
    wl = workload.gsm8k_shaped(3, 2, 64, 0)
    assert [(len(p), len(r)) for p, r in seqs] == wl.rows()
    mask = batch.batch["attention_mask"]
    assert mask.shape == (6, 192 + 64) and mask.sum().item() == sum(p + r for p, r in wl.rows())
    # left-padded prompts, right-padded responses; the response mask is the attention mask's response part
    for i, (p, r) in enumerate(wl.rows()):
        assert mask[i, 192 - p:192 + r].all() and mask[i].sum() == p + r
        assert batch.batch["input_ids"][i, 192:192 + r].tolist() == seqs[i][1]
    assert (batch.batch["response_mask"] == mask[:, 192:]).all()


def _row(overrides: list[str], olp: list[float], upd: list[float], ckpt: bool = True) -> dict:
    return {"overrides": overrides, "bare_grad_ckpt": ckpt, "fwd_tokens": 65536, "train_tokens": 32768,
            "times": {"rlpost_old_log_prob": olp, "rlpost_update": upd}}


def test_pick_takes_the_fastest_finished_variant():
    a = "actor_rollout_ref"
    result = {"variants": {
        "default": _row([], [0.8, 0.9], [3.4, 3.5]),
        "best": _row([f"{a}.model.enable_gradient_checkpointing=false", f"{a}.actor.use_torch_compile=true",
                      f"{a}.actor.fsdp_config.reshard_after_forward=false"], [0.5, 0.6], [1.8, 1.9], ckpt=False),
        "broken": {"error": "rc 1"}}}
    lines = dict(line.split("=", 1) for line in bench_phase_gap.pick(result).splitlines())
    assert lines["VARIANT"] == "best" and lines["GRAD_CKPT"] == "0" and lines["TRAIN_TOKENS"] == "32768"
    # the critic gets the model and FSDP settings, not the log-prob compile (a value head has no vocabulary)
    assert lines["CRITIC_OVERRIDES"].strip("'").split() == ["critic.model.enable_gradient_checkpointing=false",
                                                      "critic.model.fsdp_config.reshard_after_forward=false"]
    with pytest.raises(SystemExit, match="no variant finished"):
        bench_phase_gap.pick({"variants": {"broken": {"error": "rc 1"}}})


def test_session_g_commands_parse(tmp_path):
    sys.path.insert(0, str(REPO / "benchmarks"))
    from benchmarks import bench_critic, bench_gen_knobs, bench_realistic

    env = {**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable}
    out = subprocess.run(["bash", "benchmarks/gpu_session_g.sh", "--dry-run"], cwd=REPO, env=env, text=True,
                         capture_output=True, check=True).stdout.splitlines()
    cmds = {line.split(":", 1)[0]: shlex.split(line.split(":", 1)[1]) for line in out[1:]}
    real = bench_realistic.parse_args(cmds["realistic"][3:])
    assert real.rounds >= 12 and real.grad_ckpt == 0 and real.train_tokens == 32768
    assert "actor_rollout_ref.actor.use_torch_compile=true" in real.override
    crit = bench_critic.parse_args(cmds["critic"][3:])
    assert crit.rounds >= 5 and "critic.model.enable_gradient_checkpointing=false" in crit.override
    gen = cmds["gen"]
    assert gen[2] == "benchmarks.bench_gen_knobs" and "--rounds" in gen and gen[gen.index("--rounds") + 1] == "12"
    assert hasattr(bench_gen_knobs, "main")
