"""The verl side run: why it runs padded (packed rows without flash-attn mix sequences), and its command."""

from __future__ import annotations

from pathlib import Path

from benchmarks import verl_side


def test_packed_rows_need_flash_attn() -> None:
    got = verl_side.attention_check()
    assert got["flash_attention_2"].startswith("does not load")  # no flash-attn on CPU (nor on the GPU host)
    for impl in ("sdpa", "eager"):
        diff = float(got[impl].rsplit("= ", 1)[1])
        assert diff > 0.1, got  # the second sequence attends to the first: not verl's packing semantics


def test_command_is_the_example_scaled_to_one_gpu() -> None:
    cmd = verl_side.verl_command(Path("/m"), Path("/d"), steps=5, prompt_len=192, cap=1024, prompts=64, n=8)
    assert cmd[1:3] == ["-m", "verl.trainer.main_ppo"]
    for item in ("actor_rollout_ref.model.use_remove_padding=False", "actor_rollout_ref.actor.use_dynamic_bsz=True",
                 "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=8192", "actor_rollout_ref.rollout.n=8",
                 "+actor_rollout_ref.model.override_config.attn_implementation=sdpa", "data.train_batch_size=64",
                 "trainer.total_training_steps=5", "data.train_files=/d/train.parquet"):
        assert item in cmd
