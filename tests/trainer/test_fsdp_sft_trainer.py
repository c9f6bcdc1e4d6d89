"""SFT: dataset masking/truncation, config checks, loss falling, HF checkpoint loading, torchrun launch."""

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from omegaconf import DictConfig, OmegaConf

from rlpost.utils.distributed import free_port
from rlpost.data.sft_dataset import SFTDataset
from rlpost.trainer.config import CONFIG_DIR
from rlpost.keys import LOSS_MASK
from rlpost.keys import ATTENTION_MASK, INPUT_IDS, POSITION_IDS

REPO = Path(__file__).resolve().parents[2]



def sft_data(values: dict) -> DictConfig:
    """The `data` group of the packaged sft_trainer.yaml with `values` set (no default lives in a test)."""
    cfg = OmegaConf.load(CONFIG_DIR / "sft_trainer.yaml")
    cfg.data = OmegaConf.merge(cfg.data, values)
    return cfg.data



def _write_data(path: Path, n: int = 8) -> Path:
    rows = [{"prompt": f"What is {a} + {a}?", "response": f"{a} + {a} = {2 * a}. #### {2 * a}"} for a in range(n)]
    pd.DataFrame(rows).to_parquet(path)
    return path


def _config(model_dir: str, tmp_path: Path, **trainer) -> "OmegaConf":
    """sft_trainer.yaml with a tiny run's overrides (no warmup, lr 1e-3, 8 rows, batch 4)."""
    data = _write_data(tmp_path / "train.parquet")
    over = {
        "data": {
            "train_files": str(data), "val_files": str(data), "prompt_key": "prompt", "response_key": "response",
            "max_length": 64, "train_batch_size": 4, "micro_batch_size_per_gpu": 2,
        },
        "model": {"partial_pretrain": model_dir, "enable_gradient_checkpointing": True},
        "optim": {"lr": 1e-3, "weight_decay": 0.0, "warmup_steps_ratio": 0.0},
        "trainer": {"default_local_dir": str(tmp_path / "ckpt"), "total_epochs": 3, "device": "cpu",
                    "n_gpus_per_node": 1, **trainer},
    }
    return OmegaConf.merge(OmegaConf.load(REPO / "rlpost/trainer/config/sft_trainer.yaml"), over)


def _tokenizer(model_dir: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


def test_sft_dataset_masks_prompt_and_appends_eos(tiny_model_dir, tmp_path):
    tok = _tokenizer(tiny_model_dir)
    data_cfg = sft_data({"prompt_key": "prompt", "response_key": "response", "max_length": 64})
    item = SFTDataset(str(_write_data(tmp_path / "d.parquet", 2)), tok, data_cfg)[1]
    assert all(item[k].shape == (64,) for k in (INPUT_IDS, ATTENTION_MASK, POSITION_IDS, LOSS_MASK))
    n_real = int(item[ATTENTION_MASK].sum())
    assert item[ATTENTION_MASK][:n_real].all() and not item[ATTENTION_MASK][n_real:].any()
    assert item[POSITION_IDS][:n_real].tolist() == list(range(n_real))
    assert (item[INPUT_IDS][n_real:] == tok.pad_token_id).all()
    response_ids = item[INPUT_IDS][item[LOSS_MASK].bool()]
    assert response_ids[-1].item() == tok.eos_token_id
    assert tok.decode(response_ids[:-1]) == "1 + 1 = 2. #### 2"
    prompt_ids = item[INPUT_IDS][: n_real - len(response_ids)]
    expected = tok.apply_chat_template([{"role": "user", "content": "What is 1 + 1?"}], add_generation_prompt=True,
                                       tokenize=False)
    assert tok.decode(prompt_ids) == expected
    assert not item[LOSS_MASK][n_real:].any()


def test_sft_dataset_dict_keys_and_truncation(tiny_model_dir, tmp_path):
    tok = _tokenizer(tiny_model_dir)
    path = tmp_path / "nested.parquet"
    pd.DataFrame({"q": [{"text": "What is 2 + 2?"}], "a": [{"text": "2 + 2 = 4. #### 4"}]}).to_parquet(path)
    base = {"prompt_key": "q", "response_key": "a", "prompt_dict_keys": ["text"], "response_dict_keys": ["text"]}
    full = SFTDataset(str(path), tok, sft_data({**base, "max_length": 128}))[0]
    n_real = int(full[ATTENTION_MASK].sum())
    with pytest.raises(ValueError, match="max_length"):
        SFTDataset(str(path), tok, sft_data({**base, "max_length": 8}))[0]
    left = SFTDataset(str(path), tok, sft_data({**base, "max_length": 8, "truncation": "left"}))[0]
    right = SFTDataset(str(path), tok, sft_data({**base, "max_length": 8, "truncation": "right"}))[0]
    assert left[INPUT_IDS].tolist() == full[INPUT_IDS][n_real - 8 : n_real].tolist()
    assert left[LOSS_MASK].tolist() == full[LOSS_MASK][n_real - 8 : n_real].tolist()
    assert right[INPUT_IDS].tolist() == full[INPUT_IDS][:8].tolist()
    with pytest.raises(ValueError, match="data.truncation"):
        SFTDataset(str(path), tok, sft_data({**base, "max_length": 8, "truncation": "middle"}))


def test_check_sft_config_rejects_unsupported_and_bad_batches(tiny_model_dir, tmp_path):
    from rlpost.trainer.fsdp_sft_trainer import check_sft_config

    cfg = _config(tiny_model_dir, tmp_path)
    check_sft_config(cfg, world_size=2, device="cpu")
    lora = OmegaConf.merge(cfg, {"model": {"lora_rank": 8}})
    with pytest.raises(NotImplementedError, match="not supported yet: model.lora_rank"):
        check_sft_config(lora, world_size=1, device="cpu")
    with pytest.raises(ValueError, match="nearest valid: 8"):
        check_sft_config(OmegaConf.merge(cfg, {"data": {"train_batch_size": 6}}), world_size=2, device="cpu")
    with pytest.raises(ValueError, match="optim.lr_scheduler"):
        check_sft_config(OmegaConf.merge(cfg, {"optim": {"lr_scheduler": "linear"}}), world_size=1, device="cpu")


def _liger_error(cfg: DictConfig, device: str) -> str:
    from rlpost.trainer.config import ConfigError
    from rlpost.trainer.fsdp_sft_trainer import check_sft_config

    with pytest.raises(ConfigError) as err:
        check_sft_config(OmegaConf.merge(cfg, {"model": {"use_liger": True}}), world_size=1, device=device)
    assert "\n" not in str(err.value)
    return str(err.value)


@pytest.mark.timeout(60)
def test_check_sft_config_liger_refusals(tiny_model_dir, tmp_path, monkeypatch):
    """model.use_liger=true goes through the PPO actor's start-up rules, under the SFT trainer's key names."""
    from rlpost.trainer.fsdp_sft_trainer import check_sft_config
    from rlpost.engine.liger import LIGER_REQUIREMENT

    pytest.importorskip("liger_kernel.transformers.monkey_patch")
    cfg = _config(tiny_model_dir, tmp_path)
    msg = _liger_error(cfg, "cpu")
    assert msg.startswith("model.use_liger=true, trainer.device=cpu: Liger's kernels are Triton kernels for CUDA")
    assert msg.endswith("use model.use_liger=false (or trainer.device=cuda on a GPU machine).")

    gpt2 = tmp_path / "gpt2"
    gpt2.mkdir()
    (gpt2 / "config.json").write_text('{"model_type": "gpt2"}')
    msg = _liger_error(OmegaConf.merge(cfg, {"model": {"partial_pretrain": str(gpt2)}}), "cuda")
    assert msg.startswith(f"model.use_liger=true, model.partial_pretrain={gpt2} (model_type=gpt2): ")
    assert "Liger patches only the model types " in msg and "qwen2" in msg and msg.endswith("model.use_liger=false.")

    check_sft_config(OmegaConf.merge(cfg, {"model": {"use_liger": True}}), world_size=1, device="cuda")  # qwen2

    monkeypatch.setitem(sys.modules, "liger_kernel", None)  # `import liger_kernel...` raises ImportError
    monkeypatch.setitem(sys.modules, "liger_kernel.transformers.monkey_patch", None)
    msg = _liger_error(cfg, "cuda")
    assert msg.startswith("model.use_liger=true: liger_kernel is not importable")
    assert f"use `pip install {LIGER_REQUIREMENT}`" in msg and msg.endswith("or model.use_liger=false.")


@pytest.mark.timeout(60)
def test_sft_trainer_refuses_liger_on_cpu_before_loading(tiny_model_dir, tmp_path, monkeypatch):
    """The trainer runs the check before it builds the model: a CPU run with Liger on stops at start-up."""
    from rlpost.trainer.config import ConfigError
    from rlpost.trainer.fsdp_sft_trainer import run_sft

    for key, val in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                     "MASTER_PORT": str(free_port())}.items():
        monkeypatch.setenv(key, val)
    monkeypatch.setattr("transformers.AutoModelForCausalLM.from_pretrained",
                        lambda *a, **k: pytest.fail("the model was loaded before the Liger check"))
    cfg = OmegaConf.merge(_config(tiny_model_dir, tmp_path), {"model": {"use_liger": True}})
    with pytest.raises(ConfigError, match=r"^model.use_liger=true, trainer.device=cpu: "):
        run_sft(cfg)


def _response_loss(model, dataset) -> float:
    batch = {k: torch.stack([dataset[i][k] for i in range(len(dataset))]) for k in (INPUT_IDS, ATTENTION_MASK, LOSS_MASK)}
    with torch.no_grad():
        logits = model(input_ids=batch[INPUT_IDS], attention_mask=batch[ATTENTION_MASK]).logits
    nll = F.cross_entropy(logits[:, :-1].transpose(1, 2), batch[INPUT_IDS][:, 1:], reduction="none")
    mask = batch[LOSS_MASK][:, 1:].float()
    return float((nll * mask).sum() / mask.sum())


@pytest.mark.timeout(240)
def test_sft_loss_falls_and_checkpoint_loads(tiny_model_dir, tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    from rlpost.trainer.fsdp_sft_trainer import run_sft

    for key, val in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                     "MASTER_PORT": str(free_port())}.items():
        monkeypatch.setenv(key, val)  # restored after the test: other tests see a clean environment
    cfg = _config(tiny_model_dir, tmp_path, save_freq=3, max_ckpt_to_keep=1)
    history = run_sft(cfg)
    losses = [m["train/loss"] for m in history]
    assert len(history) == 6  # 8 rows / batch 4 = 2 steps per epoch x 3 epochs
    assert losses[-1] < 0.85 * losses[0]
    assert history[0]["train/lr"] == pytest.approx(1e-3) and history[-1]["train/lr"] < 1e-4  # cosine decay
    assert [p.name for p in (tmp_path / "ckpt").glob("global_step_*")] == ["global_step_6"]  # step 3 dropped
    assert (tmp_path / "ckpt" / "metrics.jsonl").read_text().count("train/loss") == 6
    saved = tmp_path / "ckpt" / "global_step_6"
    trained = AutoModelForCausalLM.from_pretrained(saved)
    original = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    dataset = SFTDataset(cfg.data.train_files, _tokenizer(str(saved)), cfg.data)
    before, after = _response_loss(original, dataset), _response_loss(trained, dataset)
    assert after < before - 0.5
    assert after == pytest.approx(history[-1]["val/loss"], rel=0.02)


@pytest.mark.e2e
@pytest.mark.timeout(280)
def test_sft_torchrun_two_processes(tiny_model_dir, tmp_path):
    data = _write_data(tmp_path / "train.parquet")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    env["OMP_NUM_THREADS"] = "1"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={free_port()}",
           "-m", "rlpost.trainer.fsdp_sft_trainer", f"data.train_files={data}", "data.val_files=null",
           "data.prompt_key=prompt", "data.response_key=response", "data.max_length=64",
           "data.train_batch_size=4", "data.micro_batch_size_per_gpu=1", "optim.lr=1e-3",
           f"model.partial_pretrain={tiny_model_dir}", f"trainer.default_local_dir={tmp_path / 'ckpt'}",
           "trainer.total_epochs=1", "trainer.device=cpu", "trainer.n_gpus_per_node=2"]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=260)
    assert proc.returncode == 0, proc.stderr[-3000:]
    saved = tmp_path / "ckpt" / "global_step_2"
    assert (saved / "model.safetensors").is_file() and (saved / "tokenizer.json").is_file()
    from transformers import AutoModelForCausalLM

    trained = AutoModelForCausalLM.from_pretrained(saved)
    original = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    data_cfg = sft_data({"prompt_key": "prompt", "response_key": "response", "max_length": 64})
    dataset = SFTDataset(str(data), _tokenizer(str(saved)), data_cfg)
    assert _response_loss(trained, dataset) < _response_loss(original, dataset)


def test_sft_dataset_renders_each_rows_tools_and_chat_prompts(tiny_model_dir, tmp_path):
    """`data.tools_key`: the row's schemas (JSON text) reach the chat template, as in multi-turn rollouts; a
    prompt may be a whole conversation (call, tool result) whose next assistant turn is the target."""
    import json

    tok = _tokenizer(tiny_model_dir)
    schema = {"type": "function", "function": {"name": "calculator", "description": "arithmetic", "parameters": {
        "type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}
    chat = [{"role": "user", "content": "What is 6*7?"},
            {"role": "assistant", "content": '<tool_call>{"name": "calculator"}</tool_call>'},
            {"role": "tool", "content": "42"}]
    rows = [{"prompt": chat[:1], "response": chat[1]["content"], "tools": json.dumps([schema])},
            {"prompt": chat, "response": "#### 42", "tools": json.dumps([schema])}]
    pd.DataFrame(rows).to_parquet(tmp_path / "tools.parquet")
    data_cfg = sft_data({"prompt_key": "prompt", "response_key": "response", "tools_key": "tools",
                         "max_length": 1024})
    ds = SFTDataset(str(tmp_path / "tools.parquet"), tok, data_cfg)
    for i, messages in enumerate([chat[:1], chat]):
        item = ds[i]
        prompt = tok.apply_chat_template(messages, tools=[schema], add_generation_prompt=True, tokenize=False)
        n_prompt = len(tok(prompt, add_special_tokens=False)["input_ids"])
        text = tok.decode(item[INPUT_IDS][: int(item[ATTENTION_MASK].sum())])
        assert text == prompt + rows[i]["response"] + tok.eos_token and "# Tools" in text
        assert item[LOSS_MASK][:n_prompt].sum() == 0 and item[LOSS_MASK][n_prompt:].sum() > 0
    assert "<tool_response>\n42\n</tool_response>" in tok.decode(ds[1][INPUT_IDS])
    with pytest.raises(KeyError, match="data.tools_key: column 'schemas'"):
        SFTDataset(str(tmp_path / "tools.parquet"), tok, sft_data({**data_cfg, "tools_key": "schemas"}))
