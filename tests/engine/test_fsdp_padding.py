"""Remove-padding packs real tokens and gives the padded path's log-probs; model loading from the composed
`model` group (override_config, value head); FSDP compute dtype and wrapping units."""

import pytest
import torch

from _compose import SMALL, compose_config
from rlpost.engine.fsdp import compute_dtype, units_to_wrap
from rlpost.utils.model import load_model
from rlpost.utils.padding import pad_output, unpad_input
from rlpost.workers.batching import loss_weights, optimizer_step


def test_unpad_pad_round_trip():
    ids = torch.tensor([[0, 5, 6], [7, 8, 0]])
    mask = torch.tensor([[0, 1, 1], [1, 1, 0]])
    pos = torch.tensor([[0, 0, 1], [0, 1, 1]])
    packed, ppos, idx = unpad_input(ids, mask, pos)
    assert packed.tolist() == [[5, 6, 7, 8]] and ppos.tolist() == [[0, 1, 0, 1]]
    assert pad_output(packed[0], idx, 2, 3).tolist() == [[0, 5, 6], [7, 8, 0]]


def _models(tiny_model_dir: str, *overrides: str):
    """(actor_rollout_ref.model, critic.model) groups of the default config pointing at the tiny model."""
    cfg = compose_config(*SMALL, f"actor_rollout_ref.model.path={tiny_model_dir}", f"critic.model.path={tiny_model_dir}",
                         "actor_rollout_ref.rollout.name=hf", *overrides)
    return cfg.actor_rollout_ref.model, cfg.critic.model


def test_packed_forward_equals_padded(tiny_model_dir):
    model = load_model(_models(tiny_model_dir)[0], torch.float32).eval()
    ids = torch.tensor([[0, 0, 11, 12, 13, 14], [21, 22, 23, 24, 25, 0]])
    mask = (ids != 0).long()
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    padded = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits
    packed, ppos, idx = unpad_input(ids, mask, pos)
    out = model(input_ids=packed, position_ids=ppos, attention_mask=None, use_cache=False).logits[0]
    unpadded = pad_output(out, idx, 2, 6)
    m = mask.bool()
    torch.testing.assert_close(unpadded[m], padded[m], atol=1e-4, rtol=1e-4)


def test_model_loading_and_wrapping_units(tiny_model_dir):
    assert compute_dtype("cpu") == torch.float32 and compute_dtype("cuda") == torch.bfloat16
    actor_model, critic_model = _models(
        tiny_model_dir, "+actor_rollout_ref.model.override_config.attention_dropout=0.25",
        "+actor_rollout_ref.model.override_config.model_config.rope_theta=500.0")
    model = load_model(actor_model, torch.float32)
    assert model.config.attention_dropout == 0.25 and model.config.rope_theta == 500.0  # model_config flattened
    value = load_model(critic_model, torch.float32, value_model=True)
    assert type(value).__name__ == "Qwen2ForTokenClassification" and value.config.num_labels == 1
    units = units_to_wrap(model)
    assert [type(u).__name__ for u in units] == ["Qwen2DecoderLayer", "Qwen2DecoderLayer", "Qwen2ForCausalLM"]
    sized = units_to_wrap(model, min_num_params=10_000)
    assert model.get_input_embeddings() not in sized and sized[-1] is model
    total = sum(p.numel() for p in model.parameters())
    assert units_to_wrap(model, min_num_params=total + 1) == [model]  # the GPU examples' one-unit wrapping
    # above one layer's size no layer is wrapped alone, nor the layer list (fully_shard refuses a container without
    # forward: a 7B model with the GPU examples' min_num_params=1e9 stopped there), and the decoder, which holds
    # the tied input embeddings, never is: the root is the one unit, the whole model gathered at once (the memory
    # estimate's premise)
    layers = model.model.layers
    one_layer = sum(p.numel() for p in layers[0].parameters())
    assert units_to_wrap(model, min_num_params=one_layer + 1) == [model]
    untied = load_model(actor_model, torch.float32)
    untied.config.tie_word_embeddings = False
    untied.lm_head.weight = torch.nn.Parameter(untied.lm_head.weight.detach().clone())
    assert units_to_wrap(untied, min_num_params=one_layer + 1) == [untied.model, untied]  # decoder, then the head
    _fully_shard_each(units_to_wrap(untied, min_num_params=one_layer + 1))


def _fully_shard_each(units):
    """fully_shard accepts every unit (one gloo rank in this process, torn down after; a one-rank group an
    in-process vLLM engine of an earlier file still holds is used as it is)."""
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    own = not dist.is_initialized()
    if own:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    assert dist.get_world_size() == 1
    try:
        for unit in units:
            fully_shard(unit)
    finally:
        if own:
            dist.destroy_process_group()


def test_nonfinite_grad_skips_step_and_loss_weights():
    lin = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(lin.parameters(), lr=1.0)
    before = lin.weight.detach().clone()
    lin(torch.tensor([[float("inf"), 1.0]])).sum().backward()
    m = optimizer_step(lin, opt, 1.0, "actor")
    assert m["actor/grad_norm_nonfinite"] == 1.0
    assert torch.equal(lin.weight, before)
    micros = [{"response_mask": torch.tensor([[1, 1, 1]])}, {"response_mask": torch.tensor([[1, 0, 0], [0, 0, 0]])}]
    assert loss_weights(micros, "token-mean") == ([0.75, 0.25], [0.75, 0.25])
    assert loss_weights(micros, "seq-mean-token-mean")[0] == pytest.approx([1 / 3, 2 / 3])
