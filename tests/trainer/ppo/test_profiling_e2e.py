"""End to end: `main_ppo` on CPU (2 worker processes, tiny model) with the torch profiler on step 2 only."""

import json
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


def test_torch_profile_of_step_2_per_rank(tmp_path, tiny_model_dir):
    data, out, profile = tmp_path / "data", tmp_path / "run", tmp_path / "profile"
    subprocess.run([sys.executable, "examples/data_preprocess/arith.py", "--local_dir", str(data),
                    "--train_size", "16", "--test_size", "4"], check=True, capture_output=True)
    cmd = [
        sys.executable, "-m", "rlpost.trainer.main_ppo", "algorithm.adv_estimator=grpo",
        f"data.train_files={data / 'train.parquet'}", f"data.val_files={data / 'test.parquet'}",
        "data.train_batch_size=4", "data.max_prompt_length=32", "data.max_response_length=4",
        f"actor_rollout_ref.model.path={tiny_model_dir}", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4", "actor_rollout_ref.actor.use_kl_loss=true",
        "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
        "trainer.device=cpu", "trainer.n_gpus_per_node=2", "trainer.total_training_steps=2",
        "trainer.test_freq=-1", "trainer.save_freq=-1", "trainer.val_before_train=false",
        "trainer.logger=[console]", "ray_init.num_cpus=2", f"trainer.default_local_dir={out}",
        "global_profiler.tool=torch", "global_profiler.steps=[2]", f"global_profiler.save_path={profile}",
        "actor_rollout_ref.actor.profiler.enable=true", "actor_rollout_ref.actor.profiler.all_ranks=true",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    # actor, rollout (follows the actor's switch) and the reference share each process: one trace per rank
    names = sorted(p.name for p in profile.iterdir())
    assert names == ["step2_actor+rollout_rank0.json", "step2_actor+rollout_rank1.json"]
    for path in profile.iterdir():
        trace = json.loads(path.read_text())
        ops = {e.get("name") for e in trace["traceEvents"]}
        assert len(trace["traceEvents"]) > 100
        assert any("aten::" in str(name) for name in ops)  # the phases' torch ops were recorded
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "timing_s/step" in r] == [1, 2]
    # on CPU no per-phase device peaks are made up
    assert not [k for r in rows for k in r if k.startswith("perf/max_memory_allocated_gb/")]
