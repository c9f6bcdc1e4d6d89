"""The memory estimate's arithmetic on a tiny hand-computed architecture."""

import pytest

from rlpost.utils.memory_estimate import (ModelShape, TrainSetup, forward_bytes, onloaded_bytes, resident_bytes,
                                          update_bytes)

pytestmark = pytest.mark.timeout(30)

# hidden 4, 2 layers, vocab 10, MLP 8, 2 query heads and 1 key/value head of size 2, untied head, qkv bias
TINY = {"hidden_size": 4, "num_hidden_layers": 2, "vocab_size": 10, "intermediate_size": 8,
        "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 2, "tie_word_embeddings": False,
        "model_type": "qwen2"}


def setup(**kw) -> TrainSetup:
    base = dict(shards=2, tokens_per_row=6, logit_rows_per_row=3, checkpointing=False, param_offload=False,
                optimizer_offload=False, offload_policy=False, entropy=False)
    return TrainSetup(**{**base, **kw})


def test_parameter_count_and_activation_bytes():
    s = ModelShape.from_config_json(TINY)
    assert (s.q_dim, s.kv_dim) == (4, 2)
    # q 4x4 + k,v 2 x 4x2 + o 4x4 = 48, bias 4+2+2 = 8, MLP 3x4x8 = 96, norms 2x4 = 8
    assert s.layer_params == 160
    assert s.root_params == 10 * 4 * 2 + 4  # embeddings + LM head + final norm
    assert s.params == 84 + 2 * 160
    # norms 2x(16+8) + qkv 2x8 + roped q,k 2x6 + attention out 2x4 + o_proj out 2x4 + MLP 8x8
    assert s.act_bytes_per_token_layer == 48 + 16 + 12 + 8 + 8 + 64


def test_experts_are_not_estimated():
    with pytest.raises(ValueError, match="mixture-of-experts"):
        ModelShape.from_config_json({**TINY, "num_experts": 8})


def test_resident_state_and_offload():
    s = ModelShape.from_config_json(TINY)  # 404 params, 202 per shard
    assert resident_bytes(s, setup()) == {"params": 4 * 202, "optimizer": 8 * 202}
    assert resident_bytes(s, setup(optimizer_offload=True)) == {"params": 808}
    assert resident_bytes(s, setup(param_offload=True, optimizer_offload=True)) == {}
    assert resident_bytes(s, setup(offload_policy=True)) == {}
    assert resident_bytes(s, setup(frozen=True)) == {"params": 2 * 202}  # bf16 reference, no optimizer
    assert onloaded_bytes(s, setup(param_offload=True, optimizer_offload=True), with_optimizer=True) == {
        "params (onloaded)": 808, "optimizer (onloaded)": 1616}


def test_update_and_forward_bytes():
    s = ModelShape.from_config_json(TINY)
    out = update_bytes(s, setup(), rows=2)  # 12 tokens, 6 response positions with logits
    assert out["grads"] == 4 * 202
    assert out["gathered"] == 2 * 2 * (84 + 2 * 160)  # bf16 root + two layers, and their grads
    assert out["activations"] == 2 * 12 * 156  # every layer keeps its activations
    # logits: bf16 + saved float32 log-softmax + bf16 grad per position, plus two float32 chunk temporaries
    assert out["logits"] == 6 * 10 * 8 + 2 * 6 * 10 * 4
    ckpt = update_bytes(s, setup(checkpointing=True, entropy=True), rows=2)
    assert ckpt["activations"] == 2 * 12 * 4 * 2 + 12 * 156  # layer inputs + one recomputed layer
    assert ckpt["logits"] == 6 * 10 * 12 + 2 * 6 * 10 * 4
    fwd = forward_bytes(s, rows=2, tokens_per_row=6, logit_rows_per_row=3)
    assert fwd == {"gathered": 808, "activations": 12 * 156, "logits": 6 * 10 * 2 + 3 * 6 * 10 * 4}
    # reshard_after_forward=false: the whole model stays gathered through a pass (bf16), grads still per unit
    assert forward_bytes(s, rows=2, tokens_per_row=6, logit_rows_per_row=3, whole=True)["gathered"] == 2 * s.params
    assert update_bytes(s, setup(gathered_pass=True), rows=2)["gathered"] == 2 * s.params + 2 * (84 + 2 * 160)
    # the Triton log-prob path (CUDA): bf16 logits (and their bf16 grad) only, no float32 chunks
    assert forward_bytes(s, rows=2, tokens_per_row=6, logit_rows_per_row=3, float32_chunks=False)["logits"] == 6 * 10 * 2
    assert update_bytes(s, setup(float32_chunks=False, entropy=True), rows=2)["logits"] == 6 * 10 * 4
    # use_no_sync_for_gradient_accumulation: the whole model's bf16 grads wait for the last micro-batch
    assert out["unsynced grads"] == 0
    assert update_bytes(s, setup(defer_grad_sync=True), rows=2)["unsynced grads"] == 4 * s.params  # fp32 reduce dtype
    # entropy_from_logits_chunk_size with chunking: the float32 temporaries follow the chunk (here 1 row of 6)
    assert update_bytes(s, setup(chunk_tokens=1), rows=2)["logits"] == 6 * 10 * 8 + 2 * 1 * 10 * 4
    assert forward_bytes(s, rows=2, tokens_per_row=6, logit_rows_per_row=3, chunk_tokens=1)["logits"] == \
        6 * 10 * 2 + 3 * 1 * 10 * 4
    assert update_bytes(s, setup(defer_grad_sync=True, shards=1), rows=2)["unsynced grads"] == 0  # nothing to sync
    assert update_bytes(s, setup(defer_grad_sync=True, frozen=True), rows=2)["unsynced grads"] == 0


def test_size_based_wrapping_above_a_layer_gathers_the_whole_model():
    s = ModelShape.from_config_json({**TINY, "num_hidden_layers": 6})  # root 84 + 6 layers of 160 = 1044
    per_layer = 2 * (84 + 2 * 160)

    def fwd(unit: int) -> int:
        return forward_bytes(s, rows=1, tokens_per_row=6, logit_rows_per_row=3, unit_params=unit)["gathered"]

    assert fwd(0) == per_layer
    assert fwd(100) == per_layer  # units below a layer's size: at most a layer at a time
    # above it no layer is wrapped alone: the decoder stack (or the root) is one unit (tests/utils/test_fsdp_padding.py)
    assert fwd(161) == fwd(10**9) == 2 * s.params
    # the update holds the gathered model and its bf16 grads
    assert update_bytes(s, setup(unit_params=161), rows=1)["gathered"] == 2 * 2 * s.params


def test_the_optimizer_state_follows_the_optimizer_class():
    from rlpost.utils.memory_estimate import optimizer_state_bytes

    # torch's state per parameter: Adam(W) exp_avg + exp_avg_sq (+ max_exp_avg_sq with amsgrad), SGD's momentum buffer
    assert optimizer_state_bytes("AdamW") == optimizer_state_bytes("Adam") == 8.0
    assert optimizer_state_bytes("Adam", {"amsgrad": True}) == 12.0
    assert optimizer_state_bytes("SGD") == 0.0 and optimizer_state_bytes("SGD", {"momentum": 0.9}) == 4.0
    assert optimizer_state_bytes("AdamW8bit") == 2.0 and optimizer_state_bytes("SomethingElse") == 8.0
    import torch

    p = torch.nn.Parameter(torch.zeros(1000))
    for name, extra in (("Adam", {"amsgrad": True}), ("SGD", {"momentum": 0.9}), ("RMSprop", {"centered": True}),
                        ("Adagrad", {})):
        opt = getattr(torch.optim, name)([p], lr=0.1, **extra)
        p.grad = torch.ones(1000)
        opt.step()
        held = sum(v.numel() * v.element_size() for v in opt.state[p].values() if torch.is_tensor(v) and v.dim())
        assert held / 1000 == optimizer_state_bytes(name, extra), name
