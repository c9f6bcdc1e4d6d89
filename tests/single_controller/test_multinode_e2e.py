"""Two Ray nodes on one machine (`ray start --head` + `ray start --address=...`, one CPU each), the trainer
attached through RAY_ADDRESS: RLOO (its end-to-end run) with trainer.nnodes=2 x n_gpus_per_node=1 puts one rank on each node,
rendezvous across them, 2 steps. Every process the test starts is ended by its process group afterwards."""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from rlpost.utils.distributed import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(400)]

REPO = Path(__file__).resolve().parents[2]
RAY = str(Path(sys.executable).with_name("ray"))
# Longer answers score higher: an untrained model's two samples of a prompt get different scores.
REWARD_FN = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return len(solution_str) / 10.0
'''


def _env() -> dict[str, str]:
    # The nodes' workers import this checkout; the throwaway cluster needs no token (it listens locally only).
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, "RAY_AUTH_MODE": "disabled"}


def _start(args: list[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen([RAY, "start", *args, "--num-cpus=1", "--block"], env=_env(), stdout=log.open("w"),
                            stderr=subprocess.STDOUT, start_new_session=True)


def _wait_for_nodes(address: str, n: int, node: subprocess.Popen, log: Path, timeout_s: float = 120) -> None:
    probe = ("import ray; ray.init(address='%s'); import sys; "
             "sys.exit(0 if sum(x['Alive'] for x in ray.nodes()) >= %d else 1)") % (address, n)
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if node.poll() is not None:
            raise RuntimeError(f"ray start exited: {log.read_text()[-2000:]}")
        try:
            if subprocess.run([sys.executable, "-c", probe], env=_env(), capture_output=True,
                              timeout=30).returncode == 0:
                return
        except subprocess.TimeoutExpired:
            pass
        time.sleep(2)
    raise TimeoutError(f"{n} Ray nodes not alive at {address} after {timeout_s} s")


def _stop(procs: list[subprocess.Popen]) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for proc in procs:
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                pass
        time.sleep(5 if sig == signal.SIGTERM else 0)
    for proc in procs:
        proc.wait(30)


def test_rloo_on_two_nodes(tmp_path, tiny_model_dir):
    subprocess.run([sys.executable, "examples/data_preprocess/arith.py", "--local_dir", str(tmp_path / "data"),
                    "--train_size", "8", "--test_size", "2"], check=True, capture_output=True, cwd=REPO)
    address = f"127.0.0.1:{free_port()}"
    ray_tmp = tempfile.mkdtemp(prefix="rl_mn_", dir="/tmp")  # Ray's socket paths must stay under 108 bytes
    procs = [_start(["--head", f"--port={address.split(':')[1]}", "--include-dashboard=false",
                     f"--temp-dir={ray_tmp}"], tmp_path / "head.log")]
    try:
        _wait_for_nodes(address, 1, procs[0], tmp_path / "head.log")
        procs.append(_start([f"--address={address}"], tmp_path / "worker.log"))
        _wait_for_nodes(address, 2, procs[1], tmp_path / "worker.log")
        run_dir = tmp_path / "run"
        (tmp_path / "reward.py").write_text(REWARD_FN)
        cmd = [sys.executable, "-m", "rlpost.trainer.main_ppo",
               f"data.train_files={tmp_path / 'data' / 'train.parquet'}", "data.val_files=null",
               "data.train_batch_size=2", "data.max_prompt_length=32", "data.max_response_length=6",
               f"actor_rollout_ref.model.path={tiny_model_dir}", "algorithm.adv_estimator=rloo",
               "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.rollout.name=hf",
               "actor_rollout_ref.rollout.tensor_model_parallel_size=1", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
               "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
               "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2", "trainer.device=cpu",
               "trainer.nnodes=2", "trainer.n_gpus_per_node=1", "trainer.total_training_steps=2",
               "trainer.save_freq=2", "trainer.test_freq=-1", "trainer.logger=[console]",
               f"custom_reward_function.path={tmp_path / 'reward.py'}",
               f"trainer.default_local_dir={run_dir}", f"trainer.rollout_data_dir={run_dir / 'rollouts'}"]
        proc = subprocess.run(cmd, env={**_env(), "RAY_ADDRESS": address}, capture_output=True, text=True,
                              timeout=300, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in rows] == [1, 2]
        # RLOO's leave-one-out baseline with n=2: each sample's advantage is its score less its sibling's, so a
        # step's advantages run from -d to +d, d the largest score gap within a prompt's pair (from the dump)
        gaps = []
        for r in rows:
            pairs: dict[str, list[float]] = {}
            for line in (run_dir / "rollouts" / f"{r['step']}.jsonl").read_text().splitlines():
                sample = json.loads(line)
                pairs.setdefault(sample["prompt"], []).append(sample["score"])
            assert sorted(len(p) for p in pairs.values()) == [2, 2], pairs
            gaps.append(max(abs(a - b) for a, b in pairs.values()))
            assert r["critic/advantages/max"] == pytest.approx(gaps[-1], abs=1e-5)
            assert r["critic/advantages/min"] == pytest.approx(-gaps[-1], abs=1e-5)
        assert max(gaps) > 0, "every pair scored alike: the check above would hold for any estimator"
        # one shard per rank: the two ranks (one per node) formed one FSDP group of 2
        shards = sorted(p.name for p in (run_dir / "global_step_2" / "actor").glob("model_world_size_2_rank_*.pt"))
        assert shards == ["model_world_size_2_rank_0.pt", "model_world_size_2_rank_1.pt"]
    finally:
        _stop(procs)
        shutil.rmtree(ray_tmp, ignore_errors=True)
