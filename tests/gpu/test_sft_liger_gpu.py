"""On one GPU, bf16: the SFT trainer with `model.use_liger=true` trains a model with Liger's Triton kernels
(RMSNorm, RoPE, SwiGLU) in it. Its first step's loss equals that of the same weights without Liger to bf16
tolerance, and after one update through Liger's backward the loss on the same rows falls as the plain run's does
and lands beside it (0.5B-shaped layers, 2 of them)."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest
from omegaconf import OmegaConf

from rlpost.trainer.config import CONFIG_DIR
from rlpost.utils.distributed import free_port

pytest.importorskip("liger_kernel.transformers.monkey_patch")
pytestmark = [pytest.mark.gpu, pytest.mark.timeout(600)]

ROWS = 16  # one global batch: every step's loss is over the same rows


@pytest.fixture
def one_rank(monkeypatch, restore_qwen2):
    """Rank 0 of 1 over nccl (the trainer joins this group), with transformers' qwen2 names restored afterwards."""
    import torch.distributed as dist

    from rlpost.utils.distributed import init_distributed

    for key, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(free_port())}.items():
        monkeypatch.setenv(key, value)
    init_distributed("cuda")
    yield
    dist.destroy_process_group()


def _train(model_dir: str, out: Path, use_liger: bool):
    """Two SFT steps (lr 1e-4, no warmup) over the same 16 rows; returns (per-step metrics, the trainer)."""
    from transformers import AutoTokenizer

    from rlpost.data.sft_dataset import SFTDataset
    from rlpost.trainer.fsdp_sft_trainer import FSDPSFTTrainer

    rows = [{"prompt": f"What is {a} * 10?", "response": f"{a} * 10 = {a * 10}. #### {a * 10}"}
            for a in range(1000, 1000 + ROWS)]
    data = out / "train.parquet"
    out.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_parquet(data)
    cfg = OmegaConf.merge(OmegaConf.load(CONFIG_DIR / "sft_trainer.yaml"), {
        "data": {"train_files": str(data), "val_files": None, "prompt_key": "prompt", "response_key": "response",
                 "max_length": 64, "train_batch_size": ROWS, "micro_batch_size_per_gpu": ROWS // 2},
        "model": {"partial_pretrain": model_dir, "use_liger": use_liger},
        "optim": {"lr": 1e-4, "warmup_steps_ratio": 0.0},
        "trainer": {"default_local_dir": str(out / "ckpt"), "total_training_steps": 2, "device": "cuda",
                    "n_gpus_per_node": 1, "logger": ["file"]},
    })
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    trainer = FSDPSFTTrainer(cfg, tokenizer, SFTDataset(str(data), tokenizer, cfg.data))
    return trainer.fit(), trainer


def test_sft_step_with_liger_matches_plain(qwen05b_layers_dir, one_rank, tmp_path):
    import torch
    from liger_kernel.transformers.rms_norm import LigerRMSNorm
    from liger_kernel.transformers.swiglu import LigerSwiGLUMLP

    plain, trainer = _train(qwen05b_layers_dir, tmp_path / "plain", False)  # first: Liger holds for later qwen2 models
    assert trainer.model.model.norm.forward.__func__ is not LigerRMSNorm.forward
    del trainer
    torch.cuda.empty_cache()

    liger, trainer = _train(qwen05b_layers_dir, tmp_path / "liger", True)
    layer = trainer.model.model.layers[0]
    assert layer.input_layernorm.forward.__func__ is LigerRMSNorm.forward
    assert layer.mlp.forward.__func__ is LigerSwiGLUMLP.forward
    for run in (plain, liger):
        assert all(math.isfinite(m["train/loss"]) and math.isfinite(m["train/grad_norm"]) for m in run), run
        assert run[1]["train/loss"] < run[0]["train/loss"], run  # one step on these rows lowers their loss
    # same weights, same rows: the first loss differs by bf16 rounding only
    assert liger[0]["train/loss"] == pytest.approx(plain[0]["train/loss"], rel=1e-2)
    assert liger[0]["train/grad_norm"] == pytest.approx(plain[0]["train/grad_norm"], rel=5e-2)
    # after one update through Liger's backward (Adam's first step scales bf16 noise up to ~lr per weight)
    assert liger[1]["train/loss"] == pytest.approx(plain[1]["train/loss"], rel=2e-2)
