"""Checkpoints a real run wrote: they merge into a HF folder whose logits are the trained actor's; a shard
damaged in place is named on resume (auto falls back to the newest intact one, resume_path refuses);
a diverging run stops after `trainer.max_nonfinite_steps` and never saves its non-finite weights."""

import json
import shutil
import subprocess
import sys

import pytest
import torch

from _e2e import command, make_data, run
from rlpost.checkpoint.manager import read_manifest, verify_files

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_model_dir):
    """A 2-step CPU GRPO run through main_ppo with trainer.save_freq=1 and the default save_contents."""
    root = tmp_path_factory.mktemp("reliability_e2e")
    make_data(root)
    proc = run(command(root, tiny_model_dir, root / "run"))
    assert proc.returncode == 0, proc.stderr[-5000:]
    return root, tiny_model_dir


def fsdp_weights(actor_dir) -> dict[str, torch.Tensor]:
    """Full tensors from the two FSDP2 rank shards (every parameter is sharded on dim 0)."""
    shards = [torch.load(actor_dir / f"model_world_size_2_rank_{r}.pt", weights_only=False) for r in range(2)]
    return {name: torch.cat([s[name] for s in shards]) for name in shards[0]}


@pytest.mark.timeout(600)
def test_default_checkpoint_merges_to_the_trained_actor(trained, tmp_path):
    from transformers import AutoModelForCausalLM

    root, model = trained
    actor = root / "run" / "global_step_2" / "actor"
    assert (actor / "huggingface" / "config.json").is_file()  # written although save_contents lacks hf_model
    meta = json.loads((actor / "fsdp_meta.json").read_text())  # the shard meta the merger reads, from the worker
    assert (meta["format"], meta["world_size"], meta["model_class"]) == ("rlpost-fsdp-v1", 2, "Qwen2ForCausalLM")
    assert meta["params"]["model.embed_tokens.weight"]["placement"] == "Shard(0)"
    out = tmp_path / "merged"
    proc = subprocess.run([sys.executable, "-m", "rlpost.model_merger", "merge", "--backend", "fsdp",
                           "--local_dir", str(actor), "--target_dir", str(out)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    merged = AutoModelForCausalLM.from_pretrained(out, torch_dtype=torch.float32).eval()
    trained_actor = AutoModelForCausalLM.from_pretrained(model, torch_dtype=torch.float32).eval()
    initial = {k: v.clone() for k, v in trained_actor.state_dict().items()}
    weights = fsdp_weights(actor)
    trained_actor.load_state_dict(weights, strict=False)
    assert any(not torch.equal(initial[k], v.to(initial[k].dtype)) for k, v in weights.items())  # it trained
    ids = torch.arange(3, 19).reshape(2, 8)
    with torch.no_grad():
        torch.testing.assert_close(merged(ids).logits, trained_actor(ids).logits, rtol=0, atol=1e-5)


def damaged_copy(root, tmp_path):
    """A copy of the run whose step-2 actor shard has 4 KiB overwritten in place (same size)."""
    run_dir = tmp_path / "run"
    shutil.copytree(root / "run", run_dir)
    shard = run_dir / "global_step_2" / "actor" / "model_world_size_2_rank_0.pt"
    size = shard.stat().st_size
    with open(shard, "r+b") as f:
        f.seek(size // 2)
        f.write(b"\xff" * 4096)
    assert shard.stat().st_size == size
    return run_dir, shard


@pytest.mark.timeout(600)
def test_damaged_shard_auto_resumes_from_newest_intact(trained, tmp_path):
    root, model = trained
    run_dir, shard = damaged_copy(root, tmp_path)
    proc = run(command(root, model, run_dir, "trainer.total_training_steps=3"))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-5000:]
    assert f"{shard}: checksum mismatch" in out
    assert f"resumed from {run_dir / 'global_step_1'} (step 1)" in out
    for step in (1, 2, 3):  # step 1 untouched, step 2 re-trained and saved intact, step 3 new
        folder = run_dir / f"global_step_{step}"
        assert verify_files(folder, read_manifest(folder)) == []
    # metrics.jsonl holds each step once: the first run's step 2, trained again, moved aside
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3], steps
    moved = (run_dir / "metrics_superseded.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in moved] == [2]


@pytest.mark.timeout(600)
def test_damaged_shard_resume_path_names_file_and_intact_one(trained, tmp_path):
    root, model = trained
    run_dir, shard = damaged_copy(root, tmp_path)
    proc = run(command(root, model, run_dir, "trainer.total_training_steps=3", "trainer.resume_mode=resume_path",
                       f"trainer.resume_from_path={run_dir / 'global_step_2'}"))
    assert proc.returncode == 2, proc.stderr[-5000:]
    assert f"{shard}: checksum mismatch" in proc.stderr
    assert f"the newest intact checkpoint is {run_dir / 'global_step_1'}" in proc.stderr
    assert not (run_dir / "global_step_3").exists()
    assert verify_files(run_dir / "global_step_1", read_manifest(run_dir / "global_step_1")) == []


@pytest.mark.timeout(600)
def test_diverging_run_stops_and_never_saves_nonfinite_weights(trained, tmp_path):
    root, model = trained
    run_dir = tmp_path / "run"
    # lr=1e4 sends the weights far enough that a later step's grad norm is NaN (the step it happens varies)
    proc = run(command(root, model, run_dir, "actor_rollout_ref.actor.optim.lr=1e4",
                       "trainer.total_training_steps=8", "trainer.max_nonfinite_steps=1"))
    assert proc.returncode == 3, (proc.stdout + proc.stderr)[-5000:]
    assert "1 consecutive steps had a non-finite loss or grad norm" in proc.stderr
    assert "trainer.max_nonfinite_steps=1" in proc.stderr and "actor_rollout_ref.actor.optim.lr" in proc.stderr
    stopped = int(proc.stderr.split("stopping at step ")[1].split(":")[0])
    assert f"step {stopped} had a non-finite update (actor/grad_norm_nonfinite=" in proc.stdout
    saved = sorted(int(p.name.rsplit("_", 1)[1]) for p in run_dir.glob("global_step_*"))
    assert saved == list(range(1, stopped))  # every finite step saved, the non-finite one not
    for step in saved:
        weights = fsdp_weights(run_dir / f"global_step_{step}" / "actor")
        assert all(torch.isfinite(w).all() for w in weights.values()), step
