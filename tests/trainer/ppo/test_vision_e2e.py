"""`main_ppo` on the tiny Qwen2-VL model: the combinations not built for vision-language models, and images for a
text-only model, stop before Ray naming the key. The shared checks of a 2-step VL run (`check_two_vl_steps`: finite
metrics, a moving policy, the engine's log-probs near the actor's; `_check_merged_checkpoint`: the merged model
loads with its processor, its frozen tower as it started and its language model trained) serve
tests/examples/test_tiny_vl_scripts.py (the frozen-tower 2-step run, packed) and test_vision_paths_e2e.py."""

import json
import math
import subprocess
import sys

import pytest
from hydra import compose, initialize_config_dir

import rlpost.trainer.config as config_pkg
from rlpost.trainer.main_ppo import run

pytestmark = pytest.mark.timeout(600)
CONFIG_DIR = config_pkg.__path__[0]
RAY_STARTED = "engine and Ray logs of this run"


@pytest.fixture(scope="module")
def vl_run(tiny_vl_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("vl_e2e")
    subprocess.run([sys.executable, "examples/data_preprocess/vision_squares.py", "--local_dir", str(root),
                    "--train_size", "8", "--test_size", "2"], check=True, capture_output=True)
    # an untrained model never writes "#### N": a score that differs between any two responses gives GRPO
    # non-zero advantages, so the update really moves the language model
    (root / "spread_reward.py").write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return (sum(map(ord, solution_str)) % 101) / 100\n")
    return root, tiny_vl_model_dir


def _args(root, model: str, run_dir, *extra: str) -> list[str]:
    return [f"data.train_files={root / 'train.parquet'}", f"data.val_files={root / 'test.parquet'}",
            "data.train_batch_size=2",
            "data.max_prompt_length=48", "data.max_response_length=6", f"actor_rollout_ref.model.path={model}",
            "algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=2",
            "actor_rollout_ref.rollout.tensor_model_parallel_size=1", "actor_rollout_ref.rollout.calculate_log_probs=true",
            "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
            "actor_rollout_ref.actor.optim.lr=1e-3", "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
            "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2", "actor_rollout_ref.actor.use_kl_loss=true",
            "actor_rollout_ref.actor.freeze_vision_tower=true",
            "trainer.device=cpu", "trainer.n_gpus_per_node=2", "trainer.total_training_steps=2",
            "trainer.save_freq=2", "trainer.test_freq=2", "trainer.logger=[console]", "ray_init.num_cpus=2",
            f"trainer.default_local_dir={run_dir}", *extra]


def _check_merged_checkpoint(actor_dir, start_dir, target):
    import torch
    from transformers import AutoModelForImageTextToText

    from rlpost.model_merger import merge
    from rlpost.utils.tokenizer import hf_processor

    merge(actor_dir, target)
    assert hf_processor(str(target)).image_processor.merge_size == 2  # the processor travels with the model
    trained = dict(AutoModelForImageTextToText.from_pretrained(target, dtype=torch.float32).named_parameters())
    start = dict(AutoModelForImageTextToText.from_pretrained(start_dir, dtype=torch.float32).named_parameters())
    assert set(trained) == set(start)
    for name, p in start.items():
        if ".visual." in f".{name}":  # freeze_vision_tower: not one step moved it
            torch.testing.assert_close(trained[name], p, atol=0, rtol=0, msg=name)
    moved = [n for n in start if "language_model" in n and not torch.equal(trained[n], start[n])]
    assert len(moved) > 10, moved


@pytest.mark.parametrize("extra, key", [
    (["actor_rollout_ref.model.lora_rank=8", "actor_rollout_ref.model.target_modules=all-linear"],
     "error: not supported yet: actor_rollout_ref.model.target_modules with a LoRA adapter in the vision tower"),
    (["actor_rollout_ref.rollout.name=hf"],
     "error: not supported yet: actor_rollout_ref.rollout.name=hf with a vision-language model"),
    (["data.return_multi_modal_inputs=false"], "error: not supported yet: data.return_multi_modal_inputs=false"),
])
def test_vl_combinations_not_built_stop_before_ray(vl_run, tmp_path, capsys, extra, key):
    root, model = vl_run
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        status = run(compose("ppo_trainer", overrides=_args(root, model, tmp_path / "run", *extra)))
    err = capsys.readouterr()
    assert status == 2, err
    assert err.err.startswith(key) and err.err.count("\n") == 1, err.err
    assert RAY_STARTED not in err.out + err.err


def test_images_for_a_text_only_model_stop_before_ray(vl_run, tiny_model_dir, tmp_path, capsys):
    root, _ = vl_run
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        status = run(compose("ppo_trainer", overrides=_args(root, tiny_model_dir, tmp_path / "run")))
    err = capsys.readouterr().err
    assert status == 2 and "holds images, but the model has no multimodal processor" in err, err


def check_two_vl_steps(proc: subprocess.CompletedProcess, run_dir) -> list[dict]:
    """A 2-step VL run ended well: finite losses, a moving policy, the engine's log-probs near the actor's.
    Returns the rows of its metrics.jsonl."""
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-4000:]}"
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "timing_s/step" in r]
    assert len(train) == 2
    for row in train:
        for key in ("actor/pg_loss", "actor/kl_loss", "actor/grad_norm", "critic/score/mean"):
            assert math.isfinite(row[key]), (key, row)
        # bf16 engine vs float32 actor on the same weights and pixels: wrong (mrope) positions, a slice of the
        # row lost under Ulysses, a missed vision weight or an adapter vLLM did not apply put whole probabilities
        # apart
        assert row["training/rollout_probs_diff_max"] < 0.2, row
        assert row["response_length/mean"] > 0 and row["actor/grad_norm"] > 0
    assert train[1]["actor/kl_loss"] > 0  # step 2's policy moved away from the reference
    return rows
