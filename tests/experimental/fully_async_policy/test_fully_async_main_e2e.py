"""verl's fully-async entry point end to end on CPU: 1 trainer process + 1 rollout process (vLLM CPU engine),
6 GRPO steps with async_training.staleness_threshold=0.5 and trigger_parameter_sync_step=2, i.e. a queue 2
batches deep, the weights pushed every 2 steps and staleness bounded by 2 (strategy wait).

Hand trace of the queue (step s may be generated once s - 1 - version <= 2): batches 1-3 with v0; batch 4 waits
for the push after step 2 (v2), batch 5 follows it; batch 6 waits for v4. So versions 0,0,0,2,2,4 and staleness
0,1,2,1,2,1. Then a run SIGKILLed during step 5 resumes from its step-4 checkpoint (batches 5 and 6 queued, 5
generated) and ends with the uninterrupted run's weights.

With async_training.partial_rollout=true (pause after trainer.v1.separate_async.partial_rollout_tokens=2) and
compute_prox_log_prob=true (decoupled PPO) the same queue gives the same batch versions, but a batch queued
across a push is paused there and resumed with the pushed weights: batch 3 holds tokens of v0 then v2, batch 5
of v2 then v4 (trained at staleness 2); batches 4 and 6 start right after a push and finish before the next.
The loss weights each token by the actor's recomputed (proximal) over its own behaviour probability. Its
SIGKILL + resume (the step-4 checkpoint holds batches 5 and 6 paused mid-response) ends with the same weights."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

REWARD_FN = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """Longer answers score higher: non-zero advantages even for an untrained model."""
    return len(solution_str) / 10.0
'''


@pytest.fixture(scope="module")
def workspace(tmp_path_factory, tiny_model_dir):
    root = tmp_path_factory.mktemp("fully_async_e2e")
    subprocess.run([sys.executable, "examples/data_preprocess/arith.py", "--local_dir", str(root / "data"),
                    "--train_size", "12", "--test_size", "2"], check=True, capture_output=True)
    (root / "reward.py").write_text(REWARD_FN)
    return root, tiny_model_dir


PARTIAL = ["async_training.partial_rollout=true", "trainer.v1.separate_async.partial_rollout_tokens=2",
           "async_training.compute_prox_log_prob=true"]


def command(root, model, name: str, *extra: str) -> list[str]:
    """verl's recipe command line (its top-level rollout.* group, data.train_batch_size=0), tiny."""
    return [
        sys.executable, "-m", "rlpost.experimental.fully_async_policy.fully_async_main",
        "--config-name=fully_async_ppo_trainer",
        f"data.train_files={root / 'data' / 'train.parquet'}", "data.val_files=null", "data.train_batch_size=0",
        "data.gen_batch_size=1", "data.max_prompt_length=32", "data.max_response_length=6",
        f"actor_rollout_ref.model.path={model}", "algorithm.adv_estimator=grpo", "rollout.n=2",
        "rollout.nnodes=1", "rollout.n_gpus_per_node=1", "rollout.total_rollout_steps=12",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.actor.optim.lr=1e-2", "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
        f"custom_reward_function.path={root / 'reward.py'}",
        "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=1",
        "async_training.staleness_threshold=0.5", "async_training.trigger_parameter_sync_step=2",
        "trainer.device=cpu", "trainer.n_gpus_per_node=1", "trainer.test_freq=-1", "trainer.logger=[console]",
        "trainer.save_freq=2", "ray_init.num_cpus=2", f"trainer.default_local_dir={root / name}", *extra,
    ]


def metrics(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def actor_weights(run_dir, step: int) -> dict[str, torch.Tensor]:
    return torch.load(run_dir / f"global_step_{step}" / "actor" / "model_world_size_1_rank_0.pt", weights_only=False)


@pytest.fixture(scope="module")
def straight(workspace):
    root, model = workspace
    proc = subprocess.run(command(root, model, "straight"), capture_output=True, text=True, timeout=500)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "config notice: data.train_batch_size=0 of verl's fully-async recipe" in proc.stderr
    return root / "straight"


@pytest.fixture(scope="module")
def straight_partial(workspace):
    root, model = workspace
    proc = subprocess.run(command(root, model, "straight_partial", *PARTIAL), capture_output=True, text=True,
                          timeout=500)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root / "straight_partial"


def test_six_fully_async_steps_stay_within_the_staleness_bound(straight):
    rows = metrics(straight)
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert [r["training/policy_version"] for r in rows] == [0, 0, 0, 2, 2, 4]
    assert [r["training/policy_staleness"] for r in rows] == [0, 1, 2, 1, 2, 1]
    for r in rows:
        hist = {k: v for k, v in r.items() if k.startswith("fully_async/staleness_hist/")}
        # every token of the step's 4 samples (2 prompts x n=2) carries the version of the weights that sampled it
        assert hist == {f"fully_async/staleness_hist/{r['training/policy_staleness']}": 4.0}
        assert r["fully_async/max_staleness"] == r["training/policy_staleness"] <= 2
        assert (r["fully_async/stale_tokens"] > 0) == (r["training/policy_staleness"] > 0)
        assert r["fully_async/queue_depth"] == 3  # the batch taken + the 2 queued behind it (the loader goes on)
        assert r["fully_async/trainer_idle_s"] >= 0 and r["fully_async/rollout_idle_s"] >= 0
        assert r["fully_async/queue_ready"] <= 2 and r["fully_async/stale_token_fraction"] == (r["step"] > 1)
        assert r["fully_async/dropped_samples"] == 0  # wait never drops
    # bypass mode (use_rollout_log_probs): the loss's old log-probs are the engine's, so the PPO ratio is
    # taken against the behaviour policy of each token
    assert all("actor/pg_clipfrac" in r for r in rows)
    assert (straight / "global_step_4" / "rollout_inflight.pt").exists()


def test_partial_rollouts_mix_versions_within_samples_and_weight_each_token_in_the_loss(straight_partial):
    rows = metrics(straight_partial)
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert [r["training/policy_version"] for r in rows] == [0, 0, 0, 2, 2, 4]  # each batch's first tokens
    assert [r["fully_async/max_staleness"] for r in rows] == [0, 1, 2, 1, 2, 1]  # its oldest tokens, <= 2
    mixed = [r["fully_async/partial_samples"] for r in rows]
    assert mixed == [0, 0, 4, 0, 4, 0]  # batches 3 and 5 were paused at a push; every sample there ran on
    for r in (rows[2], rows[4]):
        # 2 tokens of each sample held at the pause (aborted_tokens), the rest sampled by the pushed weights
        assert r["fully_async/aborted_tokens"] == 8.0 and 4 <= r["fully_async/resumed_tokens"] <= 16
        # only the 2 tokens before the pause are older than the trained policy
        assert r["fully_async/stale_tokens"] == 8.0 and 0 < r["fully_async/stale_token_fraction"] < 1
    for r in rows:
        assert r["fully_async/staleness_hist/" + str(int(r["fully_async/max_staleness"]))] == 4.0
        # decoupled PPO: per-token weights pi_prox / pi_behaviour from the recomputed and the engine's log-probs
        assert "rollout_corr/is_weight_mean" in r and "actor/pg_clipfrac" in r
    assert rows[0]["rollout_corr/log_ratio_mean"] == pytest.approx(0.0, abs=0.02)  # v0 trains v0's tokens
    assert any(abs(r["rollout_corr/log_ratio_mean"]) > 0.02 for r in rows[1:])  # stale tokens differ


@pytest.mark.timeout(900)
@pytest.mark.parametrize("mode", ["whole", "partial"])
def test_sigkill_mid_run_then_resume_ends_with_the_same_weights(mode, workspace, request):
    root, model = workspace
    reference = request.getfixturevalue("straight" if mode == "whole" else "straight_partial")
    cmd = command(root, model, f"crashed_{mode}", *(PARTIAL if mode == "partial" else ()))
    crashed, log = root / f"crashed_{mode}", root / f"crashed_{mode}" / "metrics.jsonl"
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def wait_for_step(step: int) -> None:
        deadline = time.time() + 400
        while not (log.exists() and f'"step": {step}' in log.read_text()):
            assert proc.poll() is None, f"training exited before step {step}"
            assert time.time() < deadline, f"no step {step} within 400 s"
            time.sleep(0.05)

    try:
        wait_for_step(4)  # the step-4 checkpoint is committed before step 4's metrics are logged
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    time.sleep(5)  # the workers follow their driver (test_split_e2e checks the process tree)
    assert (crashed / "global_step_4" / "manifest.json").exists() and not (crashed / "global_step_6").exists()

    resumed = subprocess.run(cmd, capture_output=True, text=True, timeout=400)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "continuing at step 5" in resumed.stdout
    want_rows, got_rows = metrics(reference), metrics(crashed)
    assert [r["step"] for r in got_rows][-2:] == [5, 6]
    for a, b in zip(want_rows[4:], got_rows[-2:]):
        assert b["training/policy_version"] == a["training/policy_version"]
        assert b["critic/score/mean"] == a["critic/score/mean"]
    if mode == "partial":  # the step-4 checkpoint held batches 5 and 6 paused mid-response
        paused = torch.load(crashed / "global_step_4" / "rollout_inflight.pt", weights_only=False)
        assert [item[3] for item in paused] == [True, True]
        for a, b in zip(want_rows[4:], got_rows[-2:]):
            assert b["fully_async/resumed_tokens"] == a["fully_async/resumed_tokens"]
    want, got = actor_weights(reference, 6), actor_weights(crashed, 6)
    assert want.keys() == got.keys()
    assert all(torch.equal(want[k], got[k]) for k in want)
