"""The tiny Qwen2-VL model in the actor's log-prob pass: a padded batch of rows with one image, two images of
different sizes and none gives each row the log-probs of that row run alone through transformers (which builds
its own mrope positions), in fixed and in dynamic (token-count) micro-batches; the 3-D positions matter (1-D ones
change the image rows); the padded batch's gradients (vision tower included) are the sum of each row's; freezing
the vision tower keeps it out of the update."""

import io
from types import SimpleNamespace

import pandas as pd
import pytest
import torch

from rlpost import keys
from rlpost.data import RLHFDataset, collate_fn
from rlpost.protocol import DataProto
from rlpost.utils.tokenizer import hf_processor

from data.test_rl_dataset import data_cfg

pytestmark = pytest.mark.timeout(240)
R = 6


def _png(size, colour):
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (size, size), colour).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def vl(tiny_vl_model_dir, tmp_path_factory):
    from transformers import AutoModelForImageTextToText

    processor = hf_processor(tiny_vl_model_dir)
    images = [[{"bytes": _png(56, (250, 0, 0))}], [{"bytes": _png(28, (0, 250, 0))}, {"bytes": _png(56, (0, 0, 9))}],
              []]
    texts = ["<image>colour?", "<image>and<image>which?", "no picture here"]
    rows = [{"data_source": "geo3k", "prompt": [{"role": "user", "content": t}], "images": im,
             "reward_model": {"ground_truth": "1"}, "extra_info": {"index": i}}
            for i, (t, im) in enumerate(zip(texts, images))]
    path = tmp_path_factory.mktemp("vl") / "vl.parquet"
    pd.DataFrame(rows).to_parquet(path)
    ds = RLHFDataset(str(path), processor.tokenizer, data_cfg(max_prompt_length=48), processor)
    batch = collate_fn([ds[i] for i in range(len(ds))])
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_pretrained(tiny_vl_model_dir, dtype=torch.float32)
    for p in model.parameters():  # larger weights: peaked attention, so wrong positions change the numbers
        p.data.normal_(0, 0.2) if p.dim() > 1 else None
    return processor, batch, model.eval()


def _full_batch(batch, vocab):
    """Prompts + random right-padded responses of lengths 6, 3, 5, as the rollout assembles them."""
    gen = torch.Generator().manual_seed(1)
    lengths = torch.tensor([6, 3, 5])
    responses = torch.randint(10, vocab - 10, (3, R), generator=gen)
    response_mask = (torch.arange(R)[None] < lengths[:, None]).long()
    responses = responses * response_mask
    mask = torch.cat([batch[keys.ATTENTION_MASK], response_mask], -1)
    pos = batch[keys.POSITION_IDS]
    pos = torch.cat([pos, pos[:, -1:] + torch.arange(1, R + 1)], -1)
    tensors = {keys.INPUT_IDS: torch.cat([batch[keys.INPUT_IDS], responses], -1), keys.ATTENTION_MASK: mask,
               keys.POSITION_IDS: pos, keys.RESPONSES: responses}
    return tensors, response_mask


def _alone(model, processor, ids, mm):
    """Log-probs of the last R tokens of one unpadded row, transformers building the mrope positions."""
    image_id = processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    kwargs = {}
    if mm:
        kwargs = {"pixel_values": mm["pixel_values"], "image_grid_thw": mm["image_grid_thw"],
                  "mm_token_type_ids": (ids == image_id).long()[None]}
    with torch.no_grad():
        logits = model(input_ids=ids[None], **kwargs).logits[0].float()
    logp = torch.log_softmax(logits[:-1], -1).gather(-1, ids[1:, None]).squeeze(-1)
    return logp[-R:]


def test_padded_vl_batch_matches_each_row_alone(vl):
    from rlpost.workers.actor import DataParallelPPOActor

    processor, batch, model = vl
    tensors, response_mask = _full_batch(batch, model.config.text_config.vocab_size)
    mm = batch[keys.MULTI_MODAL_INPUTS]
    config = SimpleNamespace(entropy_from_logits_with_chunking=False, entropy_from_logits_chunk_size=2048,
                             use_torch_compile=False, entropy_checkpointing=False)
    actor = DataParallelPPOActor(config, model, use_remove_padding=False)
    data = DataProto.from_dict(tensors=tensors, non_tensors={keys.MULTI_MODAL_INPUTS: mm},
                               meta_info={"micro_batch_size": 2, keys.META_TEMPERATURE: 1.0})
    logp, _ = actor.compute_log_prob(data)
    for i in range(3):
        n = int(response_mask[i].sum())
        real = tensors[keys.INPUT_IDS][i][tensors[keys.ATTENTION_MASK][i].bool()]
        # the row alone: its real tokens, the response padding cut (it only follows the last real token)
        want = _alone(model, processor, torch.cat([real, torch.zeros(R - n, dtype=real.dtype)]), mm[i])
        torch.testing.assert_close(logp[i, :n], want[:n], atol=1e-5, rtol=1e-5)
    # dynamic batch by real tokens (vision tokens included): rows regrouped, each keeps its own pixels
    data.meta_info.update({"use_dynamic_bsz": True, "max_token_len": int(tensors[keys.ATTENTION_MASK].sum(-1).max())})
    dynamic, _ = actor.compute_log_prob(data)
    torch.testing.assert_close(dynamic * response_mask, logp * response_mask, atol=1e-5, rtol=1e-5)
    text_only = DataProto.from_dict(tensors=tensors, meta_info={"micro_batch_size": 3, keys.META_TEMPERATURE: 1.0})
    wrong, _ = DataParallelPPOActor(config, model).compute_log_prob(text_only)  # 1-D positions, no pixels
    assert (wrong[:2] - logp[:2]).abs().max() > 1e-2  # the image rows need their pixels and 3-D positions
    torch.testing.assert_close(wrong[2], logp[2], atol=1e-5, rtol=1e-5)  # the text row does not


def _grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_padded_vl_batch_gradients_are_the_sum_of_each_rows(vl):
    """The update's gradient (vision tower included) of the summed response log-probs of the padded batch equals
    the sum of each row's gradient run alone."""
    from rlpost.engine.vision import vision_inputs
    from rlpost.workers.actor import forward_response_logits, token_logp_entropy

    processor, batch, model = vl
    tensors, response_mask = _full_batch(batch, model.config.text_config.vocab_size)
    mm = batch[keys.MULTI_MODAL_INPUTS]
    model.zero_grad()
    mb = {**tensors, keys.MM_ROW: torch.arange(3)}
    vision = vision_inputs(model, mb[keys.INPUT_IDS], mb[keys.ATTENTION_MASK], mb[keys.MM_ROW], list(mm))
    logp = forward_response_logits(model, mb, False, lambda lg, lb: token_logp_entropy(lg, lb), vision=vision)
    (logp.squeeze(-1) * response_mask).sum().backward()
    together = _grads(model)
    alone: dict = {}
    for i in range(3):
        model.zero_grad()
        n = int(response_mask[i].sum())
        real = tensors[keys.INPUT_IDS][i][tensors[keys.ATTENTION_MASK][i].bool()]
        image_id = processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
        kwargs = {} if not mm[i] else {"pixel_values": mm[i]["pixel_values"], "image_grid_thw": mm[i]["image_grid_thw"],
                                       "mm_token_type_ids": (real == image_id).long()[None]}
        logits = model(input_ids=real[None], **kwargs).logits[0].float()
        row = torch.log_softmax(logits[:-1], -1).gather(-1, real[1:, None]).squeeze(-1)
        row[len(real) - 1 - n:].sum().backward()
        for k, g in _grads(model).items():
            alone[k] = alone.get(k, 0) + g
    assert any(".visual." in f".{k}" for k in together)  # the tower gets its gradient through the pixels
    assert set(together) == set(alone)
    for k in together:
        # float32 sums in another order: within 1e-5 of the tensor's largest entry (the tied embedding's reach 25)
        scale = float(alone[k].abs().max())
        assert float((together[k] - alone[k]).abs().max()) <= 2e-5 + 1e-5 * scale, k
    model.zero_grad()


def test_freeze_vision_tower_keeps_it_out_of_the_update(vl, tiny_model_dir):
    from transformers import AutoModelForCausalLM

    from rlpost.engine.vision import freeze_vision_tower, vision_tower

    _, _, model = vl
    frozen = freeze_vision_tower(model)
    tower = vision_tower(model)
    assert frozen == sum(p.numel() for p in tower.parameters()) > 0
    assert not any(p.requires_grad for p in tower.parameters())
    assert all(p.requires_grad for p in model.model.language_model.parameters())
    for p in tower.parameters():
        p.requires_grad_(True)
    with pytest.raises(ValueError, match="freeze_vision_tower=true: Qwen2ForCausalLM has no vision tower"):
        freeze_vision_tower(AutoModelForCausalLM.from_pretrained(tiny_model_dir))


def test_real_placeholders_are_the_blocks_after_vision_start():
    """Each image takes the next <|vision_start|> directly followed by exactly its token count of <|image_pad|>
    (a tool's image later in the row too); sampled stray or short runs, and padding, stay text."""
    from rlpost.engine.vision import image_placeholders

    vs, ip, t, pad = 7, 9, 3, 0
    ids = torch.tensor([[pad, vs, ip, ip, 8, t, ip, vs, ip, pad, pad, pad],  # one image of 2, then sampled look-alikes
                        [vs, ip, ip, 8, t, ip, t, vs, ip, ip, ip, 8],  # images of 2 and (a tool's, later) 3
                        [vs, ip, t, vs, ip, ip, 8, ip, ip, t, pad, pad]])  # a short run before the real block
    mask = (ids != pad).long()
    got = image_placeholders(ids, mask, [[2], [2, 3], [2]], image_id=ip, start_id=vs)
    want = torch.zeros_like(got)
    want[0, 2:4] = want[1, 1:3] = want[1, 8:11] = want[2, 4:6] = True
    assert torch.equal(got, want)
    with pytest.raises(ValueError, match=r"row 1 of the micro-batch: image 1 \(4 tokens\) has no <\|vision_start\|>"):
        image_placeholders(ids, mask, [[2], [2, 4], [2]], image_id=ip, start_id=vs)
