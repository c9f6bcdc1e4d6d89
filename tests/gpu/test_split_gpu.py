"""Split placement over NCCL on 2 GPUs through `main_ppo`: 1 trainer GPU + 1 rollout GPU (vLLM), the weights
broadcast from the trainer's rank to the engine after each update. One-step-off runs its steps with the
policy version of each batch logged; a rollout worker that dies while it receives the weights stops the run
naming the phase, the dead worker and the newest complete checkpoint (the CPU test covers gloo)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def workspace(tmp_path_factory, tiny_model_dir):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    root = tmp_path_factory.mktemp("split_gpu")
    subprocess.run([sys.executable, "examples/data_preprocess/arith.py", "--local_dir", str(root / "data"),
                    "--train_size", "16", "--test_size", "2"], check=True, capture_output=True)
    return root, tiny_model_dir


def command(root, model, run_dir, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "rlpost.trainer.main_ppo",
        f"data.train_files={root / 'data' / 'train.parquet'}", "data.val_files=null", "data.train_batch_size=4",
        "data.max_prompt_length=32", "data.max_response_length=16", f"actor_rollout_ref.model.path={model}",
        "algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.3",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1", "actor_rollout_ref.rollout.calculate_log_probs=true",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8", "actor_rollout_ref.actor.optim.lr=1e-3",
        "actor_rollout_ref.hybrid_engine=false", "actor_rollout_ref.rollout.nnodes=1",
        "actor_rollout_ref.rollout.n_gpus_per_node=1", "actor_rollout_ref.rollout.free_cache_engine=false",
        "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=1",
        "trainer.device=cuda", "trainer.n_gpus_per_node=1", "trainer.test_freq=-1", "trainer.logger=[console]",
        "trainer.staleness=1", f"trainer.default_local_dir={run_dir}", *extra,
    ]


def test_one_step_off_over_nccl(workspace, tmp_path):
    root, model = workspace
    run_dir = tmp_path / "one_step_off"
    proc = subprocess.run(command(root, model, run_dir, "trainer.total_training_steps=3", "trainer.save_freq=-1"),
                          capture_output=True, text=True, timeout=500)
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["training/policy_staleness"] for r in rows] == [0, 1, 1]


def test_rollout_worker_dying_in_the_nccl_transfer_is_named(workspace, tmp_path):
    from rlpost.checkpoint.manager import read_manifest, verify_files
    from rlpost.workers.weight_sync import DIE_IN_RECEIVE_ENV

    root, model = workspace
    run_dir = tmp_path / "dies"
    proc = subprocess.run(command(root, model, run_dir, "trainer.total_training_steps=6", "trainer.save_freq=2",
                                  "actor_rollout_ref.nccl_timeout=120"),
                          capture_output=True, text=True, timeout=500, env={**os.environ, DIE_IN_RECEIVE_ENV: "3"})
    err = proc.stderr
    assert proc.returncode != 0
    logs = sorted((run_dir / "logs").glob("worker_rollout_rank0_pid*.log"))
    assert len(logs) == 1, logs
    pid = logs[0].stem.split("_pid")[1]
    assert "update_weights (the weight transfer to the rollout pool, policy version 2) failed: " \
           f"rollout_pool/rollout rank 0 (pid {pid}) died" in err, err[-4000:]
    assert f"The newest checkpoint, {run_dir / 'global_step_2'} (step 2), is complete" in err
    manifest = read_manifest(run_dir / "global_step_2")
    assert manifest is not None and verify_files(run_dir / "global_step_2", manifest) == []
