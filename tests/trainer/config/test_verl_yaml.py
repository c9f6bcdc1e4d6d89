"""verl's example YAMLs (`defaults: [ppo_trainer, _self_]` + overrides), with `verl` renamed, compose in rlpost.

The YAMLs below have the shape of verl's `examples/sglang_multiturn/config/gsm8k_multiturn_grpo*.yaml`:
a Hydra search path to the trainer config folder, the default list, then a few overrides.
"""

import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

REPO = Path(__file__).resolve().parents[3]

MULTITURN = """hydra:
  searchpath:
    - file://rlpost/trainer/config

defaults:
  - ppo_trainer
  - _self_

data:
  max_prompt_length: 1024
  max_response_length: 1024
  train_batch_size: 256
  return_raw_chat: True

actor_rollout_ref:
  hybrid_engine: True
  rollout:
    name: sglang
    multi_turn:
      enable: True
      max_assistant_turns: 5
"""


def test_verl_multiturn_yaml_composes(tmp_path):
    (tmp_path / "gsm8k_multiturn_grpo.yaml").write_text(MULTITURN)
    from rlpost.trainer.config import CONFIG_DIR

    with initialize_config_dir(str(tmp_path), version_base=None):
        cfg = compose("gsm8k_multiturn_grpo", overrides=[f"hydra.searchpath=[file://{CONFIG_DIR}]"])
    assert cfg.actor_rollout_ref.rollout.multi_turn.max_assistant_turns == 5
    assert cfg.data.return_raw_chat is True and cfg.data.train_batch_size == 256
    assert cfg.actor_rollout_ref.rollout.multi_turn.max_turns == 5  # the older name follows the new one
    assert cfg.algorithm.rollout_correction.rollout_is is None  # the rest comes from ppo_trainer


@pytest.mark.timeout(120)
def test_verl_multiturn_yaml_dry_run_through_main_ppo(tmp_path):
    (tmp_path / "gsm8k_multiturn_grpo.yaml").write_text(MULTITURN)
    cmd = [sys.executable, "-m", "rlpost.trainer.main_ppo", f"--config-path={tmp_path}",
           "--config-name=gsm8k_multiturn_grpo", "trainer.dry_run=true", "algorithm.adv_estimator=grpo",
           "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.actor.ppo_mini_batch_size=64",
           "actor_rollout_ref.rollout.tensor_model_parallel_size=1", f"hydra.run.dir={tmp_path / 'out'}"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=50, cwd=REPO)
    # verl's YAML asks for SGLang, whose agent front runs the multi-turn loops; the vLLM engine does too
    assert out.returncode == 0, out.stdout + out.stderr
    assert "rlpost dry run" in out.stdout
    out = subprocess.run([*cmd, "actor_rollout_ref.rollout.name=vllm"], capture_output=True, text=True, timeout=50,
                         cwd=REPO)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "rlpost dry run" in out.stdout
