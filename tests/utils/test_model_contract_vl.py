"""The model-support contract for the vision-language families (tiny Qwen2-VL and Qwen2.5-VL): a batch of rows
with one image, two images of different sizes and none gives every row, on every training path, the log-probs,
entropies and parameter gradients (vision tower included) that row gets run alone and unpadded through
transformers, which builds its own 3-D (mrope) positions from the images.

Paths: padded, packed (use_remove_padding: mrope positions (3, 1, N) and the pixels on the packed row), packed
with gradient checkpointing, LoRA on the language model with the vision tower frozen, Ulysses SP=2 on 2 gloo
ranks. Tolerances as in tests/utils/test_model_contract.py (float32 on CPU).

The responses hold sampled `<|vision_start|>` / `<|image_pad|>` tokens (a whole fake placeholder block in row 0,
stray ones in the others, the text row included): they are text. The truth embeds each row alone with the image
features scattered into its prompt's placeholders only and takes `get_rope_index` on those alone (hand-built;
transformers' own forward refuses these rows: more image tokens than features).
"""

from __future__ import annotations

import copy
import io
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from rlpost import keys

from data.test_rl_dataset import data_cfg

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workers"))  # _fsdp_helpers.spawn

pytestmark = pytest.mark.timeout(300)
ARCHS = ("qwen2_vl", "qwen2_5_vl")
# Ulysses slices the language model's input the same way for both (the hook sits after the tower): the newer one
ULYSSES_ARCHS = ("qwen2_5_vl",)
R = 6
TEMPERATURE = 0.7
VALUE_ATOL = 5e-5
GRAD_TOL = 5e-5


def _png(size: int, colour: tuple) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (size, size), colour).save(buf, format="PNG")
    return buf.getvalue()


def vl_case(arch: str, out_dir: Path):
    """(model with larger random weights, batch with responses, per-row multi_modal_inputs, image token id)."""
    from transformers import AutoModelForImageTextToText

    from rlpost.data import RLHFDataset, collate_fn
    from rlpost.utils.tiny_vl_model import build_tiny_vl_model
    from rlpost.utils.tokenizer import hf_processor

    path = build_tiny_vl_model(out_dir / arch, arch=arch)
    processor = hf_processor(str(path))
    # a 112x84 image: 4x3 merged patches, two of Qwen2.5-VL's attention windows
    images = [[{"bytes": _png(56, (250, 0, 0))}], [{"bytes": _png(28, (0, 250, 0))}, {"bytes": _png(112, (9, 0, 90))}],
              []]
    texts = ["<image>colour?", "<image>and<image>which?", "no picture here"]
    rows = [{"data_source": "geo3k", "prompt": [{"role": "user", "content": t}], "images": im,
             "reward_model": {"ground_truth": "1"}, "extra_info": {"index": i}}
            for i, (t, im) in enumerate(zip(texts, images))]
    pd.DataFrame(rows).to_parquet(out_dir / f"{arch}.parquet")
    ds = RLHFDataset(str(out_dir / f"{arch}.parquet"), processor.tokenizer, data_cfg(max_prompt_length=64), processor)
    batch = collate_fn([ds[i] for i in range(len(ds))])
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_pretrained(str(path), dtype=torch.float32)
    for p in model.parameters():  # larger weights: peaked attention, so a wrong position or mask shows
        p.data.normal_(0, 0.2) if p.dim() > 1 else None
    vocab = model.config.text_config.vocab_size
    gen = torch.Generator().manual_seed(1)
    response_mask = (torch.arange(R)[None] < torch.tensor([6, 3, 5])[:, None]).long()
    responses = torch.randint(10, vocab - 10, (3, R), generator=gen)
    start, pad = model.config.vision_start_token_id, model.config.image_token_id
    responses[0, 1:] = torch.tensor([start, pad, pad, pad, pad])  # row 0's own image has 4 tokens: a look-alike
    responses[1, :3] = torch.tensor([pad, start, pad])
    responses[2, 1:5] = torch.tensor([pad, pad, start, pad])
    responses = responses * response_mask
    pos = batch[keys.POSITION_IDS]
    tensors = {keys.INPUT_IDS: torch.cat([batch[keys.INPUT_IDS], responses], -1),
               keys.ATTENTION_MASK: torch.cat([batch[keys.ATTENTION_MASK], response_mask], -1),
               keys.POSITION_IDS: torch.cat([pos, pos[:, -1:] + torch.arange(1, R + 1)], -1),
               keys.RESPONSES: responses, keys.RESPONSE_MASK: response_mask, keys.MM_ROW: torch.arange(3)}
    return model.eval(), tensors, list(batch[keys.MULTI_MODAL_INPUTS]), model.config.image_token_id


def _weights(batch) -> torch.Tensor:
    return torch.linspace(-1.0, 1.0, 3 * R * 2).reshape(3, R, 2) * batch[keys.RESPONSE_MASK][..., None]


def _grads(model) -> dict[str, torch.Tensor]:
    return {n.replace("base_model.model.", ""): p.grad.clone() for n, p in model.named_parameters()
            if p.requires_grad and p.grad is not None}


def per_row_truth(model, batch, mm, image_id):
    """Each row alone, unpadded, transformers' own mrope positions: its (R, 2) [log-prob, entropy] and the summed
    gradients of the weighted stats."""
    from rlpost.workers.actor import token_logp_entropy

    model.zero_grad(set_to_none=True)
    w = _weights(batch)
    out = torch.zeros(3, R, 2)
    inner = model.get_base_model().model if hasattr(model, "get_base_model") else model.model
    for i in range(3):
        ids = batch[keys.INPUT_IDS][i][batch[keys.ATTENTION_MASK][i].bool()][None]
        n, k = ids.shape[1], int(batch[keys.RESPONSE_MASK][i].sum())
        real = (ids == image_id) & (torch.arange(n) < n - k)  # the prompt's placeholders; the response's are text
        embeds = inner.get_input_embeddings()(ids)
        kwargs = {}
        if mm[i]:
            feats = inner.get_image_features(mm[i]["pixel_values"], mm[i]["image_grid_thw"], return_dict=True)
            embeds = embeds.masked_scatter(real[..., None], torch.cat(feats.pooler_output))
            kwargs["position_ids"], _ = inner.get_rope_index(ids, mm_token_type_ids=real.long(),
                                                             image_grid_thw=mm[i]["image_grid_thw"])
        logits = model(inputs_embeds=embeds, use_cache=False, **kwargs).logits[0]
        both = token_logp_entropy(logits[n - k - 1:n - 1], ids[0, n - k:], TEMPERATURE, True)
        (both * w[i, :k]).sum().backward()
        out[i, :k] = both.detach()
    return out, _grads(model)


def path_stats(model, batch, mm, rmpad: bool, sp=None) -> torch.Tensor:
    """(3, R, 2) stats through the actor's forward (`forward_response_logits`) with the batch's vision inputs."""
    from rlpost.engine.vision import vision_inputs
    from rlpost.workers.actor import forward_response_logits, token_logp_entropy

    vision = vision_inputs(model, batch[keys.INPUT_IDS], batch[keys.ATTENTION_MASK], batch[keys.MM_ROW], mm)
    return forward_response_logits(model, batch, rmpad, lambda lg, lb: token_logp_entropy(
        lg, lb, TEMPERATURE, True, chunk=4), sp, vision=vision)


def close(got, want, grads, want_grads, mask, where: str) -> None:
    m = mask.bool()
    torch.testing.assert_close(got[m], want[m], atol=VALUE_ATOL, rtol=0, msg=lambda s: f"{where}: {s}")
    assert grads.keys() == want_grads.keys(), where
    for name, g in grads.items():
        tol = GRAD_TOL * max(float(want_grads[name].abs().max()), 1e-3)
        torch.testing.assert_close(g, want_grads[name], atol=tol, rtol=0, msg=lambda s, n=name: f"{where} {n}: {s}")


def _with_lora(model):
    """PEFT LoRA on the language model's linear layers, the vision tower frozen (what the worker builds)."""
    from peft import LoraConfig, get_peft_model

    from rlpost.engine.vision import freeze_vision_tower

    freeze_vision_tower(model)
    torch.manual_seed(1)
    return get_peft_model(model, LoraConfig(r=4, lora_alpha=8, init_lora_weights=False,
                                            target_modules=r".*language_model.*\.(q_proj|k_proj|v_proj|o_proj|"
                                                           r"gate_proj|up_proj|down_proj)"))


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    out = tmp_path_factory.mktemp("vl_contract")
    return {arch: vl_case(arch, out) for arch in ARCHS}


@pytest.mark.parametrize("arch", ARCHS)
def test_every_vl_path_equals_each_row_alone(cases, arch):
    from rlpost.engine.packed_attention import use_packed_attention

    model, batch, mm, image_id = cases[arch]
    row = batch[keys.INPUT_IDS][0][batch[keys.ATTENTION_MASK][0].bool()][None]
    with pytest.raises(ValueError, match="do not match"):  # the sampled placeholders break transformers' own count
        model(input_ids=row, pixel_values=mm[0]["pixel_values"], image_grid_thw=mm[0]["image_grid_thw"],
              mm_token_type_ids=(row == image_id).long())
    want, want_grads = per_row_truth(model, batch, mm, image_id)
    assert any(".visual." in f".{n}" for n in want_grads)  # the tower is trained through the pixels
    for path in ("padded", "packed", "packed_checkpointing", "lora"):
        m = copy.deepcopy(model)
        w, wg = want, want_grads
        if path == "lora":
            m = _with_lora(m)
            w, wg = per_row_truth(m, batch, mm, image_id)
            assert not any(".visual." in f".{n}" for n in wg) and any("lora_B" in n for n in wg)
        if path != "padded":
            use_packed_attention(m)
        if path == "packed_checkpointing":
            m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        m.zero_grad(set_to_none=True)
        got = path_stats(m, batch, mm, rmpad=path != "padded")
        (got * _weights(batch)).sum().backward()
        close(got.detach(), w, _grads(m), wg, batch[keys.RESPONSE_MASK], f"{arch}/{path}")


def test_packed_rows_need_their_3d_positions(cases):
    """The packed path with the text positions on all three mrope axes (the pixels still in) moves the image rows'
    values."""
    from rlpost.engine.packed_attention import use_packed_attention
    from rlpost.engine.vision import vision_inputs
    from rlpost.workers.actor import forward_response_logits, token_logp_entropy

    model, batch, mm, _ = cases["qwen2_vl"]
    m = copy.deepcopy(model)
    use_packed_attention(m)
    with torch.no_grad():
        right = path_stats(m, batch, mm, rmpad=True)
        vision = vision_inputs(m, batch[keys.INPUT_IDS], batch[keys.ATTENTION_MASK], batch[keys.MM_ROW], mm)
        vision[keys.POSITION_IDS] = batch[keys.POSITION_IDS][None].expand(3, -1, -1)  # text positions on all 3 axes
        flat = forward_response_logits(m, batch, True, lambda lg, lb: token_logp_entropy(lg, lb, TEMPERATURE, True),
                                       vision=vision)
    assert (flat[:2, :, 0] - right[:2, :, 0]).abs().max() > 1e-2
    torch.testing.assert_close(flat[2], right[2], atol=1e-5, rtol=0)  # the text row's positions are 1-D anyway


def _ulysses_rank(rank: int, out_dir: str) -> None:
    import torch.distributed as dist

    from rlpost.engine.packed_attention import use_packed_attention
    from rlpost.engine.ulysses import new_sequence_parallel, use_ulysses_attention
    from rlpost.utils.distributed import init_distributed

    # built before the process group: transformers saves from the main process only once one exists
    cases = {arch: vl_case(arch, Path(out_dir) / f"rank{rank}") for arch in ULYSSES_ARCHS}
    init_distributed("cpu")
    sp = new_sequence_parallel(2)
    for arch in ULYSSES_ARCHS:
        model, batch, mm, image_id = cases[arch]
        want, want_grads = per_row_truth(model, batch, mm, image_id)
        m = copy.deepcopy(model)
        use_packed_attention(m)
        use_ulysses_attention(m, 2)
        m.zero_grad(set_to_none=True)
        got = path_stats(m, batch, mm, rmpad=True, sp=sp)
        (got * _weights(batch)).sum().backward()
        grads = _grads(m)
        for g in grads.values():  # the group's sum is size x the full gradient (the gather's backward)
            dist.all_reduce(g, group=sp.group)
            g /= sp.size
        close(got.detach(), want, grads, want_grads, batch[keys.RESPONSE_MASK], f"{arch}/ulysses")
    if rank == 0:
        Path(out_dir, "ulysses.txt").write_text(" ".join(ULYSSES_ARCHS))


def test_vl_ulysses_on_two_gloo_ranks_equals_each_row_alone(tmp_path):
    from _fsdp_helpers import spawn  # noqa: E402

    spawn(_ulysses_rank, (str(tmp_path),), str(tmp_path))
    assert (tmp_path / "ulysses.txt").read_text() == " ".join(ULYSSES_ARCHS)
