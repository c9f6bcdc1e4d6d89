"""rlpost.engine.lora against PEFT itself (single process), and LoRA's bad inputs: config errors and start-up
errors of `main_ppo` naming the key or file and what to use."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from _compose import SMALL, compose_config

from rlpost.trainer.config import ConfigError
from rlpost.engine.lora import (adapter_tensors, apply_lora, check_adapter_folder, check_target_modules,
                               merged_params, save_adapter)

pytestmark = pytest.mark.timeout(120)
ARR = "actor_rollout_ref"


def _model_cfg(model_dir: str, *overrides: str):
    return compose_config(*SMALL, f"{ARR}.model.path={model_dir}", f"{ARR}.model.lora_rank=4", *overrides
                          ).actor_rollout_ref.model


def _trained_peft(model_dir: str, *overrides: str):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    peft_model = apply_lora(model, _model_cfg(model_dir, *overrides), f"{ARR}.model")
    for name, p in peft_model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.2)  # fresh adapters are exact no-ops: give them something to merge
    return model, peft_model


def test_only_adapters_train_in_float32(tiny_model_dir):
    model, _ = _trained_peft(tiny_model_dir)
    trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_" in n and p.dtype == torch.float32 for n, p in trainable.items())
    assert {n.split(".")[-4] for n in trainable} >= {"q_proj", "k_proj", "v_proj", "o_proj", "down_proj"}


def test_merged_params_equal_peft_merge_and_unload(tiny_model_dir):
    model, peft_model = _trained_peft(tiny_model_dir)
    ours = dict(merged_params(model, model.state_dict().items(), None))
    want = peft_model.merge_and_unload().state_dict()
    assert set(ours) == set(want)
    for name, tensor in want.items():
        torch.testing.assert_close(ours[name], tensor, atol=1e-6, rtol=0)


def test_adapter_folder_loads_back_into_peft_with_the_same_outputs(tiny_model_dir, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model, peft_model = _trained_peft(tiny_model_dir)
    save_adapter(str(tmp_path), adapter_tensors(model.state_dict().items()), peft_model.peft_config["default"])
    ids = torch.tensor([[3, 9, 27, 81, 12]])
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    with torch.no_grad():
        loaded = PeftModel.from_pretrained(base, str(tmp_path))(ids).logits
        torch.testing.assert_close(loaded, peft_model(ids).logits, atol=1e-6, rtol=0)
    saved = json.loads((tmp_path / "adapter_config.json").read_text())
    assert saved["r"] == 4 and saved["base_model_name_or_path"] == tiny_model_dir


def test_target_modules_matching_nothing_lists_the_linear_layers(tiny_model_dir):
    cfg = _model_cfg(tiny_model_dir, f"{ARR}.model.target_modules=[attn_qkv]")
    with pytest.raises(ValueError) as err:
        check_target_modules(cfg, f"{ARR}.model")
    assert f"{ARR}.model.target_modules=" in str(err.value)
    assert "'q_proj'" in str(err.value) and "'down_proj'" in str(err.value)


def test_a_typo_among_valid_target_modules_is_refused_naming_it(tiny_model_dir):
    # one valid name would train alone: q_projj matches nothing while v_proj does
    cfg = _model_cfg(tiny_model_dir, f"{ARR}.model.target_modules=[q_projj,v_proj]")
    with pytest.raises(ValueError) as err:
        check_target_modules(cfg, f"{ARR}.model")
    message = str(err.value)
    assert message.startswith(f"{ARR}.model.target_modules=['q_projj', 'v_proj']: ['q_projj'] match no module")
    assert "'q_proj'" in message and "use ['v_proj'] or all-linear" in message
    check_target_modules(_model_cfg(tiny_model_dir, f"{ARR}.model.target_modules=[q_proj,v_proj]"), f"{ARR}.model")


def test_adapter_folder_errors_name_the_file_and_the_difference(tiny_model_dir, tmp_path):
    from rlpost.utils.tiny_model import build_tiny_model

    with pytest.raises(ValueError, match="adapter_config.json not found or not JSON"):
        check_adapter_folder(str(tmp_path / "none"), _model_cfg(tiny_model_dir), None, f"{ARR}.model")
    model, peft_model = _trained_peft(tiny_model_dir)
    save_adapter(str(tmp_path / "a"), adapter_tensors(model.state_dict().items()), peft_model.peft_config["default"])
    with pytest.raises(ValueError, match=r"has r=4 but actor_rollout_ref.model.lora_rank=8; set .*lora_rank=4"):
        check_adapter_folder(str(tmp_path / "a"), _model_cfg(tiny_model_dir, f"{ARR}.model.lora_rank=8"), None,
                             f"{ARR}.model")
    other_dir = str(build_tiny_model(tmp_path / "wide", hidden_size=256, num_heads=4, intermediate_size=512))
    _, other = _trained_peft(other_dir)
    other_model = other.base_model.model
    save_adapter(str(tmp_path / "b"), adapter_tensors(other_model.state_dict().items()), other.peft_config["default"])
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    with pytest.raises(ValueError, match=r"adapter_model.safetensors holds .*lora_A.weight with (256|512) inputs, "
                                         r"but .* has (128|256) there: the adapter was trained on another base"):
        check_adapter_folder(str(tmp_path / "b"), _model_cfg(tiny_model_dir), base, f"{ARR}.model")


@pytest.mark.parametrize("override, message", [
    (f"{ARR}.model.lora_rank=-1", "lora_rank=-1: must be 0 (LoRA off) or a rank >= 1"),
    (f"{ARR}.model.lora_alpha=0", "lora_alpha=0: the LoRA scaling must be > 0"),
    ("critic.model.lora_rank=-2", "critic.model.lora_rank=-2"),
])
def test_bad_lora_sizes_are_config_errors(override, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        compose_config(*SMALL, override)


def test_sglang_with_lora_is_refused_by_name():
    with pytest.raises(ConfigError, match="not supported yet: actor_rollout_ref.model.lora_rank=8 with"):
        compose_config(*SMALL, f"{ARR}.model.lora_rank=8", f"{ARR}.rollout.name=sglang", "trainer.device=cuda")


def test_main_ppo_stops_on_unmatched_target_modules_before_ray(tiny_model_dir, tmp_path, capsys):
    from hydra import compose, initialize_config_dir

    from rlpost.trainer.config import CONFIG_DIR
    from rlpost.trainer.main_ppo import run

    subprocess.run([sys.executable, "examples/data_preprocess/arith.py", "--local_dir", str(tmp_path),
                    "--train_size", "8", "--test_size", "4"], check=True, capture_output=True)
    overrides = [*SMALL, f"{ARR}.model.path={tiny_model_dir}", f"data.train_files={tmp_path / 'train.parquet'}",
                 f"data.val_files={tmp_path / 'test.parquet'}", "data.max_prompt_length=32",
                 "algorithm.adv_estimator=grpo", f"{ARR}.rollout.n=2", f"{ARR}.model.lora_rank=8",
                 f"{ARR}.model.target_modules=[qkv]"]
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        status = run(compose("ppo_trainer", overrides=overrides))
    err = capsys.readouterr().err
    assert status == 2, err
    assert err.startswith("error: actor_rollout_ref.model.target_modules=") and "'gate_proj'" in err


def test_a_saved_adapter_alone_turns_lora_on_with_its_own_rank(tiny_model_dir, tmp_path):
    """As in verl: `lora_adapter_path` without `lora_rank` trains that adapter further; rank, alpha and target
    modules are the adapter's own (PEFT reads them from adapter_config.json)."""
    from rlpost.trainer.config.plan import dry_run_plan
    from rlpost.utils.lora_config import lora_enabled, lora_rank_of

    model, peft_model = _trained_peft(tiny_model_dir)
    save_adapter(str(tmp_path / "a"), adapter_tensors(model.state_dict().items()), peft_model.peft_config["default"])
    cfg = compose_config(*SMALL, f"{ARR}.model.path={tiny_model_dir}", f"{ARR}.model.lora_adapter_path={tmp_path}/a",
                         f"{ARR}.actor.use_kl_loss=true")
    model_cfg = cfg.actor_rollout_ref.model
    assert model_cfg.lora_rank == 0 and lora_enabled(model_cfg) and lora_rank_of(model_cfg) == 4
    check_adapter_folder(str(tmp_path / "a"), model_cfg, None, f"{ARR}.model")  # any saved rank fits rank 0
    plan = dry_run_plan(cfg)
    assert f"LoRA: actor trains the adapters saved in {tmp_path}/a (rank 4, its own alpha and target modules)" in plan
    assert "reference log-probs = the actor with its adapters disabled" in plan
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    wrapped = apply_lora(base, model_cfg, f"{ARR}.model")
    assert wrapped.peft_config["default"].r == 4 and any(p.requires_grad for p in wrapped.parameters())
    ids = torch.tensor([[3, 9, 27, 81, 12]])
    with torch.no_grad():
        torch.testing.assert_close(wrapped(ids).logits, peft_model(ids).logits, atol=1e-6, rtol=0)
    assert not lora_enabled(compose_config(*SMALL).actor_rollout_ref.model)
    missing = compose_config(*SMALL, f"{ARR}.model.lora_adapter_path={tmp_path}/none").actor_rollout_ref.model
    assert lora_enabled(missing) and lora_rank_of(missing) is None  # start-up's check names the missing file


def test_sglang_with_only_a_saved_adapter_is_refused_by_name():
    with pytest.raises(ConfigError, match="not supported yet: actor_rollout_ref.model.lora_adapter_path=/x with"):
        compose_config(*SMALL, f"{ARR}.model.lora_adapter_path=/x", f"{ARR}.rollout.name=sglang", "trainer.device=cuda")
