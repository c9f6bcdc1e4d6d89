"""Crash and resume, end to end: a driver killed with SIGKILL after step 3 has started leaves no process behind
(Ray's head processes share its fate; its workers and Ray's agents are ended by the workers' driver watch and
rlpost's reaper, whichever comes first), and the run resumes from the step-2 checkpoint,
sees the same prompts in the same order as an uninterrupted run, and ends with the same weights."""

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from test_ppo_e2e import REQUIRED

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

REWARD_FN = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None, scale=1.0):
    """Longer answers score higher: gives non-zero advantages even for an untrained model."""
    return scale * len(solution_str) / 10.0
'''


@pytest.fixture(scope="module")
def workspace(tmp_path_factory, tiny_model_dir):
    root = tmp_path_factory.mktemp("resume_e2e")
    subprocess.run([sys.executable, "examples/data_preprocess/arith.py", "--local_dir", str(root / "data"),
                    "--train_size", "32", "--test_size", "4"], check=True, capture_output=True)
    (root / "reward.py").write_text(REWARD_FN)
    return root, tiny_model_dir


def command(root, model, name: str) -> list[str]:
    # Greedy rollouts make generation independent of the engine's sampler state, so a resumed run can
    # reproduce an uninterrupted one exactly; entropy_coeff gives every step a non-zero update.
    return [
        sys.executable, "-m", "rlpost.trainer.main_ppo",
        f"data.train_files={root / 'data' / 'train.parquet'}", "data.val_files=null", "data.train_batch_size=4",
        "data.max_prompt_length=32", "data.max_response_length=6", f"actor_rollout_ref.model.path={model}",
        "algorithm.adv_estimator=reinforce_plus_plus", "actor_rollout_ref.rollout.n=1",
        "actor_rollout_ref.rollout.do_sample=false", "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
        "actor_rollout_ref.actor.optim.lr=1e-3", "actor_rollout_ref.actor.entropy_coeff=0.01",
        "actor_rollout_ref.actor.optim.lr_scheduler=cosine", "actor_rollout_ref.actor.optim.lr_warmup_steps=1",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
        f"custom_reward_function.path={root / 'reward.py'}", "+custom_reward_function.reward_kwargs.scale=2.0",
        "trainer.device=cpu", "trainer.n_gpus_per_node=2", "trainer.total_training_steps=4",
        "trainer.save_freq=2", "trainer.test_freq=-1", "trainer.logger=[console]", "ray_init.num_cpus=2",
        f"trainer.default_local_dir={root / name}", f"trainer.rollout_data_dir={root / name / 'rollouts'}",
    ]


def descendants(pid: int) -> dict[int, tuple[str, str]]:
    """{pid: (start time, command line)} of every process below `pid` (Linux /proc)."""
    parent, info = {}, {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()  # state, ppid, ...; starttime: 20th
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        parent[int(entry.name)], info[int(entry.name)] = int(fields[1]), (fields[19], cmdline)
    found, frontier = {}, [pid]
    while frontier:
        frontier = [p for p, pp in parent.items() if pp in frontier and p not in found]
        found.update({p: info[p] for p in frontier})
    return found


def still_running(procs: dict[int, tuple[str, str]]) -> dict[int, str]:
    """The processes of `procs` still alive as themselves (not a reused pid, not a zombie)."""
    alive = {}
    for pid, (start, cmdline) in procs.items():
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[19] == start and fields[0] != "Z":
            alive[pid] = cmdline
    return alive


def prompts_of(run_dir, step: int) -> list[str]:
    return [json.loads(line)["prompt"] for line in (run_dir / "rollouts" / f"{step}.jsonl").read_text().splitlines()]


def actor_weights(run_dir, step: int) -> dict[str, torch.Tensor]:
    actor = run_dir / f"global_step_{step}" / "actor"
    weights = {}
    for rank in range(2):
        shard = torch.load(actor / f"model_world_size_2_rank_{rank}.pt", weights_only=False)
        weights.update({f"{rank}/{k}": v for k, v in shard.items()})
    return weights


def test_sigkill_then_resume_matches_uninterrupted_run(workspace):
    root, model = workspace
    straight = subprocess.run(command(root, model, "straight"), capture_output=True, text=True, timeout=400)
    assert straight.returncode == 0, straight.stderr[-5000:]
    rows = [json.loads(line) for line in (root / "straight" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    for row in rows:  # every step's metrics of the reinforce_plus_plus estimator, as test_ppo_e2e checks them
        for key in REQUIRED:
            assert isinstance(row[key], (int, float)) and math.isfinite(row[key]), (row["step"], key, row.get(key))

    crashed = root / "crashed"
    proc = subprocess.Popen(command(root, model, "crashed"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 400
    metrics = crashed / "metrics.jsonl"
    # The step-2 checkpoint is committed before step 2's metrics are logged: once they are, step 3 has begun.
    while time.time() < deadline and not (metrics.exists() and '"step": 2' in metrics.read_text()):
        assert proc.poll() is None, "training exited before step 2"
        time.sleep(0.2)
    tree = descendants(proc.pid)
    assert sum(cmd.startswith("ray::WorkerHost") for _, cmd in tree.values()) == 2, tree
    os.kill(proc.pid, signal.SIGKILL)  # the driver alone: nothing is left to shut Ray down
    proc.wait()
    killed = time.time()
    while still_running(tree) and time.time() < killed + 20:
        time.sleep(0.2)
    assert still_running(tree) == {}, f"left running 20 s after the driver's SIGKILL: {still_running(tree)}"
    assert (crashed / "global_step_2" / "manifest.json").exists()
    assert not (crashed / "global_step_4").exists()

    resumed = subprocess.run(command(root, model, "crashed"), capture_output=True, text=True, timeout=400)
    assert resumed.returncode == 0, resumed.stderr[-5000:]
    assert "resumed from" in resumed.stdout and "continuing at step 3" in resumed.stdout
    steps = [json.loads(line)["step"] for line in metrics.read_text().splitlines()]
    assert steps[-2:] == [3, 4]
    for step in (3, 4):
        assert prompts_of(crashed, step) == prompts_of(root / "straight", step)
    a, b = actor_weights(root / "straight", 4), actor_weights(crashed, 4)
    assert a.keys() == b.keys()
    changed = actor_weights(root / "straight", 2)
    assert any(not torch.equal(changed[k], a[k]) for k in a), "steps 3-4 did not update the actor"
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=1e-6, rtol=0, msg=k)

    again = subprocess.run(command(root, model, "crashed"), capture_output=True, text=True, timeout=400)
    assert again.returncode == 0 and "training already complete" in again.stdout
    assert "engine and Ray logs of this run" not in again.stdout  # found before Ray and the workers start
