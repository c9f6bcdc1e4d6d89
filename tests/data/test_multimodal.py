"""verl's multi-modal rows through RLHFDataset with the tiny Qwen2-VL processor: image entries of every form,
vision tokens in the prompt ids and in the length checks, the engine's unexpanded ids, and each bad row's one
start-up error naming the file and row."""

import io

import numpy as np
import pandas as pd
import pytest

from rlpost import keys
from rlpost.data import RLHFDataset
from rlpost.utils.tokenizer import hf_processor
from rlpost.utils.vl_processor import allow_missing_video_processor

from data.test_rl_dataset import data_cfg

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def processor(tiny_vl_model_dir):
    allow_missing_video_processor()
    return hf_processor(tiny_vl_model_dir)


def png(size: int, colour: tuple[int, int, int] = (200, 30, 30)) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (size, size), colour).save(buf, format="PNG")
    return buf.getvalue()


def vl_rows(images_per_row: list[list], text: str = "<image>How many squares?") -> list[dict]:
    return [{"data_source": "geo3k", "prompt": [{"role": "user", "content": text * max(len(imgs), 1)
                                                 if imgs else "no picture"}],
             "images": imgs, "reward_model": {"style": "rule", "ground_truth": "1"}, "extra_info": {"index": i}}
            for i, imgs in enumerate(images_per_row)]


def write(tmp_path, data, name="vl.parquet"):
    path = tmp_path / name
    pd.DataFrame(data).to_parquet(path)
    return str(path)


def test_image_rows_expand_to_vision_tokens(processor, tmp_path):
    from PIL import Image

    file_img = tmp_path / "a.png"
    file_img.write_bytes(png(56, (0, 0, 255)))
    data = vl_rows([[{"bytes": png(56)}], [{"image": str(file_img)}], [{"bytes": png(28)}, {"bytes": png(56)}], []])
    ds = RLHFDataset(write(tmp_path, data), processor.tokenizer, data_cfg(max_prompt_length=64), processor)
    image_id = processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    # 56x56 px: 4x4 patches of 14 px, merged 2x2 -> 4 vision tokens; 28x28 -> 1
    for row, want in zip(range(4), ([4], [4], [1, 4], [])):
        item = ds[row]
        ids = item[keys.INPUT_IDS][item[keys.ATTENTION_MASK].bool()].tolist()
        mm = item[keys.MULTI_MODAL_INPUTS]
        assert ids.count(image_id) == sum(want)
        assert item[keys.RAW_PROMPT_IDS].count(image_id) == len(want)  # the engine expands each one itself
        assert len(ids) == len(item[keys.RAW_PROMPT_IDS]) + sum(want) - len(want)
        if want:
            assert mm["image_grid_thw"].tolist() == [[1, 2 * int(w ** 0.5), 2 * int(w ** 0.5)] for w in want]
            assert mm["pixel_values"].shape == (4 * sum(want), 3 * 2 * 14 * 14)
            assert all(isinstance(im, Image.Image) for im in item[keys.MULTI_MODAL_DATA]["image"])
        else:
            assert mm == {} and item[keys.MULTI_MODAL_DATA] == {}


def test_vision_tokens_count_in_overlong_filter(processor, tmp_path):
    data = vl_rows([[{"bytes": png(28)}], [{"bytes": png(112)}]])  # 1 and 16 vision tokens
    path = write(tmp_path, data)
    short = len(RLHFDataset(path, processor.tokenizer, data_cfg(max_prompt_length=64), processor)[0][
        keys.RAW_PROMPT_IDS])
    limit = short + 4  # row 0 fits, row 1 only by its text
    ds = RLHFDataset(path, processor.tokenizer, data_cfg(max_prompt_length=limit, filter_overlong_prompts=True),
                     processor)
    assert len(ds) == 1 and ds[0][keys.EXTRA_INFO]["index"] == 0
    with pytest.raises(ValueError, match=r"vl.parquet row 1: prompt is \d+ tokens.*vision tokens included"):
        RLHFDataset(path, processor.tokenizer, data_cfg(max_prompt_length=limit, truncation="left"), processor)


@pytest.mark.parametrize("entry, images, match", [
    ({"image": "/nonexistent/x.png"}, None, "row 1: image file not found: /nonexistent/x.png"),
    ({"bytes": b"not an image"}, None, "row 1: image bytes cannot be decoded"),
    (None, 2, "row 1: the prompt has 1 '<image>' placeholder.* has 2 image"),
])
def test_bad_rows_name_file_and_row(processor, tmp_path, entry, images, match):
    data = vl_rows([[{"bytes": png(28)}], [entry] if entry else [{"bytes": png(28)}] * images])
    data[1]["prompt"] = [{"role": "user", "content": "<image>what?"}]
    with pytest.raises(ValueError, match=match):
        RLHFDataset(write(tmp_path, data), processor.tokenizer, data_cfg(max_prompt_length=64), processor)


def test_text_rows_with_a_vl_processor_stay_text(processor, tmp_path):
    data = vl_rows([[], []])
    for row in data:
        row["images"] = None
    ds = RLHFDataset(write(tmp_path, data), processor.tokenizer, data_cfg(), processor)
    assert ds.mm is None and keys.MULTI_MODAL_INPUTS not in ds[0]
    assert np.array_equal(ds[0][keys.RAW_PROMPT_IDS], ds[0][keys.INPUT_IDS][ds[0][keys.ATTENTION_MASK].bool()])
