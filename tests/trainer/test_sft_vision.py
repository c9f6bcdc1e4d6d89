"""SFT on verl's multi-modal rows (data.image_key) with the tiny Qwen2-VL model: the dataset expands each image
into its vision tokens and keeps its pixels per row, bad rows stop naming file and row, and the trainer's loss
equals the one the model computes itself from the processor's own inputs (labels on the response), before and
after training; the checkpoint loads with its processor."""

import io

import pandas as pd
import pytest
import torch
from omegaconf import OmegaConf

from rlpost.data.multimodal import MultiModalRowError
from rlpost.data.sft_dataset import SFTDataset, collate
from rlpost.keys import ATTENTION_MASK, INPUT_IDS, LOSS_MASK, MULTI_MODAL_INPUTS
from rlpost.trainer.config import CONFIG_DIR
from rlpost.utils.distributed import free_port

QUESTION = "<image>Which colour is the square?"


def _png(colour: str, size: int) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (size, size), colour).save(buf, format="PNG")
    return buf.getvalue()


def _rows(n: int) -> list[dict]:
    colours = ["red", "blue"]  # two picture sizes: 4 and 16 vision tokens, ragged pixel_values
    return [{"prompt": QUESTION, "response": f"#### {colours[i % 2]}",
             "images": [{"bytes": _png(colours[i % 2], 56 if i % 2 else 112)}]} for i in range(n)]


def _config(model_dir: str, tmp_path, files, **data):
    over = {"data": {"train_files": files, "val_files": None, "prompt_key": "prompt", "response_key": "response",
                     "image_key": "images", "max_length": 64, "train_batch_size": 4, "micro_batch_size_per_gpu": 2,
                     **data},
            "model": {"partial_pretrain": model_dir},
            "optim": {"lr": 3e-3, "weight_decay": 0.0, "warmup_steps_ratio": 0.0},
            "trainer": {"default_local_dir": str(tmp_path / "ckpt"), "total_training_steps": 6, "device": "cpu",
                        "n_gpus_per_node": 1, "logger": ["console"]}}
    return OmegaConf.merge(OmegaConf.load(CONFIG_DIR / "sft_trainer.yaml"), over)


def _tools(model_dir: str):
    from transformers import AutoTokenizer

    from rlpost.utils.tokenizer import hf_processor

    return AutoTokenizer.from_pretrained(model_dir), hf_processor(model_dir)


@pytest.mark.timeout(240)
def test_dataset_expands_images_and_stops_on_bad_rows(tiny_vl_model_dir, tmp_path):
    path = tmp_path / "sft.parquet"
    pd.DataFrame(_rows(2)).to_parquet(path)
    tok, processor = _tools(tiny_vl_model_dir)
    cfg = _config(tiny_vl_model_dir, tmp_path, str(path)).data
    ds = SFTDataset(str(path), tok, cfg, processor)
    image_id = tok.convert_tokens_to_ids("<|image_pad|>")
    small, large = ds[1], ds[0]  # 56 px: a 4x4 patch grid -> 4 tokens; 112 px: 8x8 -> 16
    assert int((small[INPUT_IDS] == image_id).sum()) == 4 and int((large[INPUT_IDS] == image_id).sum()) == 16
    assert small[MULTI_MODAL_INPUTS]["image_grid_thw"].tolist() == [[1, 4, 4]]
    assert small[MULTI_MODAL_INPUTS]["pixel_values"].shape[0] == 16 and large[MULTI_MODAL_INPUTS]["pixel_values"].shape[0] == 64
    response = tok("#### blue", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    n = int(small[ATTENTION_MASK].sum())
    assert small[INPUT_IDS][n - len(response):n].tolist() == response
    assert small[LOSS_MASK].tolist() == [0] * (n - len(response)) + [1] * len(response) + [0] * (64 - n)
    batch = collate([small, large])
    assert batch[INPUT_IDS].shape == (2, 64) and len(batch[MULTI_MODAL_INPUTS]) == 2

    bad = tmp_path / "bad.parquet"
    pd.DataFrame(_rows(2) + [{"prompt": "no placeholder", "response": "x", "images": [{"bytes": _png("red", 56)}]}]
                 ).to_parquet(bad)
    with pytest.raises(MultiModalRowError, match=rf"{bad} row 2: the prompt has 0 '<image>' placeholder\(s\) but"):
        SFTDataset(str(bad), tok, cfg, processor)
    with pytest.raises(ValueError, match=r"data.image_key='images' needs the model's processor"):
        SFTDataset(str(path), tok, cfg, None)
    with pytest.raises(ValueError, match=r"rows with images are not truncated: raise data.max_length"):
        SFTDataset(str(path), tok, OmegaConf.merge(cfg, {"max_length": 20}), processor)[0]


def _hf_response_loss(model, processor, rows: list[dict]) -> float:
    """Token-mean NLL of the responses, computed by the model itself (`labels`) from the processor's own
    batch: its input ids, pixels and grids, its 3-D positions left to the model."""
    from PIL import Image

    total, count = 0.0, 0
    for row in rows:
        messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION[7:]}]}]
        prompt = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        image = Image.open(io.BytesIO(row["images"][0]["bytes"])).convert("RGB")
        full = processor(text=[prompt + row["response"] + "<|im_end|>"], images=[image], return_tensors="pt")
        n_prompt = processor(text=[prompt], images=[image], return_tensors="pt")["input_ids"].shape[1]
        labels = full["input_ids"].clone()
        labels[:, :n_prompt] = -100
        with torch.no_grad():
            loss = model(**full, labels=labels).loss
        n = int((labels[:, 1:] != -100).sum())
        total, count = total + float(loss) * n, count + n
    return total / count


@pytest.mark.timeout(300)
def test_sft_with_images_matches_the_models_own_loss(tiny_vl_model_dir, tmp_path, monkeypatch):
    from transformers import AutoModelForImageTextToText

    from rlpost.trainer.fsdp_sft_trainer import run_sft
    from rlpost.utils.tokenizer import hf_processor

    for key, val in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                     "MASTER_PORT": str(free_port())}.items():
        monkeypatch.setenv(key, val)
    rows = _rows(4)
    path = tmp_path / "sft.parquet"
    pd.DataFrame(rows).to_parquet(path)
    # one micro-batch per step (batch 4 = micro 4): the logged loss is the pre-update token mean of all 4 rows
    history = run_sft(_config(tiny_vl_model_dir, tmp_path, str(path), micro_batch_size_per_gpu=4))
    start = AutoModelForImageTextToText.from_pretrained(tiny_vl_model_dir)
    processor = hf_processor(tiny_vl_model_dir)
    assert history[0]["train/loss"] == pytest.approx(_hf_response_loss(start, processor, rows), rel=1e-4)
    saved = tmp_path / "ckpt" / "global_step_6"
    trained, saved_processor = AutoModelForImageTextToText.from_pretrained(saved), hf_processor(str(saved))
    assert saved_processor is not None  # the processor files are in the checkpoint
    after = _hf_response_loss(trained, saved_processor, rows)
    assert after < 0.7 * history[0]["train/loss"]
