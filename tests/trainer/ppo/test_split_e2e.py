"""Split placement end to end through `main_ppo` on CPU: 1 trainer process + 1 rollout process (HF engine),
the weights broadcast over gloo after each update.

One-step-off-policy (trainer.staleness=1): each batch's policy version is logged and lags by one step, and a
run whose driver is killed with SIGKILL during step 3 resumes from its step-2 checkpoint (which keeps the batch
generated ahead) and ends with exactly the weights of the uninterrupted run. On-policy split placement
(staleness 0) with `rollout.mode=async`: the engine gets the new weights every step (rollout and actor log-probs
agree; LoRA adapters merged into the broadcast), the reference policy the actor with its adapters off."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from test_resume_e2e import descendants, still_running

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(400)]

REWARD_FN = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """Longer answers score higher: non-zero advantages even for an untrained model."""
    return len(solution_str) / 10.0
'''


@pytest.fixture(scope="module")
def workspace(tmp_path_factory, tiny_model_dir):
    root = tmp_path_factory.mktemp("split_e2e")
    subprocess.run([sys.executable, "examples/data_preprocess/arith.py", "--local_dir", str(root / "data"),
                    "--train_size", "8", "--test_size", "2"], check=True, capture_output=True)
    (root / "reward.py").write_text(REWARD_FN)
    return root, tiny_model_dir


def command(root, model, name: str, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "rlpost.trainer.main_ppo",
        f"data.train_files={root / 'data' / 'train.parquet'}", "data.val_files=null", "data.train_batch_size=2",
        "data.max_prompt_length=32", "data.max_response_length=6", f"actor_rollout_ref.model.path={model}",
        "algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.rollout.name=hf",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1", "actor_rollout_ref.rollout.calculate_log_probs=true",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.actor.optim.lr=1e-2", "actor_rollout_ref.actor.entropy_coeff=0.01",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
        f"custom_reward_function.path={root / 'reward.py'}",
        "actor_rollout_ref.hybrid_engine=false", "actor_rollout_ref.rollout.nnodes=1",
        "actor_rollout_ref.rollout.n_gpus_per_node=1", "actor_rollout_ref.rollout.checkpoint_engine."
        "update_weights_bucket_megabytes=1",
        "trainer.device=cpu", "trainer.n_gpus_per_node=1", "trainer.test_freq=-1", "trainer.logger=[console]",
        "ray_init.num_cpus=2", f"trainer.default_local_dir={root / name}", *extra,
    ]


def run(cmd: list[str]) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=380)
    assert proc.returncode == 0, proc.stderr[-3000:]


def metrics(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def actor_weights(run_dir, step: int) -> dict[str, torch.Tensor]:
    return torch.load(run_dir / f"global_step_{step}" / "actor" / "model_world_size_1_rank_0.pt", weights_only=False)


@pytest.fixture(scope="module")
def one_step_off(workspace):
    root, model = workspace
    run(command(root, model, "straight", "trainer.staleness=1", "trainer.total_training_steps=4",
                "trainer.save_freq=2"))
    return root / "straight"


def test_one_step_off_batches_carry_their_policy_version(one_step_off):
    rows = metrics(one_step_off)
    assert [r["training/policy_version"] for r in rows] == [0, 0, 1, 2]  # batch k+1 made with the weights of k-1
    assert [r["training/policy_staleness"] for r in rows] == [0, 1, 1, 1]
    drift = [r["training/rollout_probs_diff_max"] for r in rows]
    assert drift[0] < 1e-3  # step 1: the engine holds exactly the actor's weights (sent at start-up)
    assert min(drift[1:]) > 10 * drift[0]  # later steps: the batch came from the previous policy
    assert all(r["perf/weight_sync_bytes"] > 0 for r in rows)
    assert (one_step_off / "global_step_2" / "rollout_inflight.pt").exists()


@pytest.mark.timeout(900)  # the uninterrupted run (module fixture) when this test runs alone, then two launches
def test_sigkill_mid_run_then_resume_ends_with_the_same_weights(one_step_off, workspace):
    """The driver is killed (SIGKILL) once step 2 is logged, as step 3 trains and batch 4 is generated ahead; the
    relaunch resumes from the step-2 checkpoint (which keeps the batch generated ahead for step 3) and ends
    exactly where the uninterrupted run ended."""
    root, model = workspace
    cmd = command(root, model, "crashed", "trainer.staleness=1", "trainer.total_training_steps=4",
                  "trainer.save_freq=2")
    crashed, log = root / "crashed", root / "crashed" / "metrics.jsonl"
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def wait_for_step(step: int) -> None:
        deadline = time.time() + 240
        while not (log.exists() and f'"step": {step}' in log.read_text()):
            assert proc.poll() is None, f"training exited before step {step}"
            assert time.time() < deadline, f"no step {step} within 240 s"
            time.sleep(0.05)

    try:
        wait_for_step(1)
        tree = descendants(proc.pid)  # the run's processes, seen while it trains
        # The step-2 checkpoint is committed before step 2's metrics are logged: once they are, step 3 has begun
        # (a tiny step may finish before the kill lands; the step-4 checkpoint must not exist, checked below).
        wait_for_step(2)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    killed = time.time()
    hosts = sum(cmd_line.startswith("ray::WorkerHost") for _, cmd_line in tree.values())
    assert hosts == 2, tree  # the trainer's and the rollout's worker processes were seen
    while still_running(tree) and time.time() < killed + 30:  # the workers follow their driver
        time.sleep(0.2)
    assert still_running(tree) == {}, f"left running 30 s after the driver's SIGKILL: {still_running(tree)}"
    assert (crashed / "global_step_2" / "manifest.json").exists()
    assert not (crashed / "global_step_4").exists()

    resumed = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "continuing at step 3" in resumed.stdout
    straight, after = metrics(one_step_off), metrics(crashed)
    assert [r["step"] for r in after][-2:] == [3, 4]
    for a, b in zip(straight[2:], after[-2:]):
        assert b["training/policy_version"] == a["training/policy_version"]
        assert b["critic/score/mean"] == a["critic/score/mean"]
    want, got = actor_weights(one_step_off, 4), actor_weights(crashed, 4)
    assert want.keys() == got.keys()
    assert all(torch.equal(want[k], got[k]) for k in want)


def test_on_policy_split_with_async_rollout_and_lora_syncs_every_step(workspace):
    """LoRA (merge=true): the trainer folds the adapters into the broadcast; the engine then generates from the
    trained policy (drift ~0) while the reference (adapters off) drifts away from it (KL > 0)."""
    root, model = workspace
    run(command(root, model, "on_policy", "trainer.total_training_steps=3", "trainer.save_freq=-1",
                "actor_rollout_ref.rollout.mode=async", "actor_rollout_ref.actor.use_kl_loss=true",
                "actor_rollout_ref.model.lora_rank=8", "actor_rollout_ref.model.lora_alpha=16",
                "actor_rollout_ref.model.lora.merge=true"))
    rows = metrics(root / "on_policy")
    assert [r["training/policy_staleness"] for r in rows] == [0, 0, 0]
    assert all(r["training/rollout_probs_diff_max"] < 1e-3 for r in rows)  # each batch from the current weights
    assert all(r["timing_s/update_weights"] > 0 for r in rows)
    assert all("timing_s/ref" in r for r in rows) and rows[-1]["actor/kl_loss"] > 0


def test_rollout_worker_killed_mid_run_stops_the_trainer_naming_it(workspace, tmp_path):
    """SIGKILL of the rollout process while one-step-off training runs: the driver stops within seconds with the
    rollout group and the dead worker's log named; the newest checkpoint is complete and intact."""
    from rlpost.checkpoint.manager import read_manifest, verify_files

    root, model = workspace
    run_dir = tmp_path / "killed"
    cmd = command(root, model, "killed", "trainer.staleness=1", "trainer.total_training_steps=500",
                  "trainer.save_freq=2")
    cmd[cmd.index(f"trainer.default_local_dir={root / 'killed'}")] = f"trainer.default_local_dir={run_dir}"
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        while not (run_dir / "global_step_2").is_dir() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        logs = sorted((run_dir / "logs").glob("worker_rollout_rank0_pid*.log"))
        assert proc.poll() is None and len(logs) == 1, (proc.poll(), logs)
        os.kill(int(logs[0].stem.split("_pid")[1]), signal.SIGKILL)
        killed_at = time.monotonic()
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    assert time.monotonic() - killed_at < 60
    # the call that finds the worker dead: generate_sequences, the layout query that precedes its dispatch, or
    # (when the kill lands while the next policy is being sent, as on a loaded machine) the weight transfer
    found_by_call = "rollout_pool/rollout." in err and "failed on rank(s) [0]" in err
    found_by_transfer = "weight transfer to the rollout pool" in err and "rollout_pool/rollout rank 0" in err
    assert found_by_call or found_by_transfer, err[-3000:]
    assert "died" in err and str(logs[0]) in err
    newest = int((run_dir / "latest_checkpointed_iteration.txt").read_text())
    manifest = read_manifest(run_dir / f"global_step_{newest}")
    assert newest >= 2 and manifest is not None and verify_files(run_dir / f"global_step_{newest}", manifest) == []


def test_rollout_worker_dying_in_the_weight_transfer_is_named_not_the_trainer_send(workspace, tmp_path):
    """The rollout process ends (SIGKILL) as it starts receiving the weights of step 2 (its third transfer:
    start-up, step 1, step 2) while the trainer gathers and broadcasts them: the run stops within seconds naming
    the phase and the dead rollout worker, not the trainer's failed send, and the step-2 checkpoint is intact."""
    from rlpost.checkpoint.manager import read_manifest, verify_files
    from rlpost.workers.weight_sync import DIE_IN_RECEIVE_ENV

    root, model = workspace
    run_dir = tmp_path / "dies_in_transfer"
    cmd = command(root, model, "unused", "trainer.staleness=1", "trainer.total_training_steps=6",
                  "trainer.save_freq=2")
    cmd[cmd.index(f"trainer.default_local_dir={root / 'unused'}")] = f"trainer.default_local_dir={run_dir}"
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=380, env={**os.environ, DIE_IN_RECEIVE_ENV: "3"})
    err = proc.stderr
    assert proc.returncode != 0
    assert time.time() - (run_dir / "global_step_2").stat().st_mtime < 60  # step 3, the death, then the stop
    logs = sorted((run_dir / "logs").glob("worker_rollout_rank0_pid*.log"))
    assert len(logs) == 1, logs
    pid = logs[0].stem.split("_pid")[1]
    assert "update_weights (the weight transfer to the rollout pool, policy version 2) failed: " \
           f"rollout_pool/rollout rank 0 (pid {pid}) died; its output is in {logs[0]}" in err, err[-4000:]
    assert f"The newest checkpoint, {run_dir / 'global_step_2'} (step 2), is complete" in err
    assert not (run_dir / "global_step_4").exists()
    manifest = read_manifest(run_dir / "global_step_2")
    assert manifest is not None and verify_files(run_dir / "global_step_2", manifest) == []


def test_dynamic_sampling_one_step_off(workspace):
    """DAPO's dynamic sampling with one-step-off generation: the extra batches of a step come from the queue
    generated ahead (each draw submits the next), the step's policy version is its oldest batch's."""
    root, model = workspace
    (root / "parity.py").write_text(
        "import zlib\n\n\ndef compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return float(zlib.crc32(solution_str.encode()) % 2)  # about half the groups vary\n")
    run(command(root, model, "dapo", "trainer.staleness=1", "trainer.total_training_steps=3", "trainer.save_freq=-1",
                "trainer.total_epochs=50", "data.gen_batch_size=2", f"custom_reward_function.path={root / 'parity.py'}",
                "algorithm.filter_groups.enable=true", "algorithm.filter_groups.metric=seq_reward",
                "algorithm.filter_groups.max_num_gen_batches=30"))
    rows = metrics(root / "dapo")
    assert [r["training/policy_staleness"] for r in rows] == [0, 1, 1]
    assert all(0.0 < r["training/filter_groups_kept_fraction"] <= 1.0 for r in rows)
    # sampling is seeded by (step, rank): the same draws on every run; at least one step drew a second batch
    assert sum(r["training/num_gen_batches"] for r in rows) > 3
