"""Activation offload: gradients equal to the plain run's with and without gradient checkpointing; activations
are offloaded, parameters never; no-grad passes and a failing forward leave no hooks behind."""

import pytest
import torch

from rlpost.engine.activation_offload import ActivationOffload, enable_activation_offload

pytestmark = pytest.mark.timeout(60)


def _grads(model_dir: str, offload: bool, checkpointing: bool) -> tuple[dict[str, torch.Tensor], int]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    hooks = enable_activation_offload(model, "cpu") if offload else None
    ids = torch.randint(3, 200, (2, 16), generator=torch.Generator().manual_seed(0))
    model(input_ids=ids, labels=ids).loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    return grads, (hooks.offloaded_bytes if hooks else 0)


@pytest.mark.parametrize("checkpointing", [False, True])
def test_offload_gives_equal_grads(tiny_model_dir, checkpointing):
    plain, _ = _grads(tiny_model_dir, offload=False, checkpointing=checkpointing)
    offloaded, moved = _grads(tiny_model_dir, offload=True, checkpointing=checkpointing)
    assert plain.keys() == offloaded.keys()
    for name in plain:
        assert torch.equal(plain[name], offloaded[name]), name
    assert moved > 0
    if checkpointing:  # only what is saved outside the checkpointed layers moves
        _, moved_plain = _grads(tiny_model_dir, offload=True, checkpointing=False)
        assert moved < moved_plain


def test_parameters_are_not_offloaded_and_hooks_are_scoped():
    lin = torch.nn.Linear(8, 8)
    hooks = enable_activation_offload(lin, "cpu")
    x = torch.randn(4, 8)
    with torch.no_grad():
        lin(x)
    assert hooks.offloaded_bytes == 0 and not hooks._active  # no-grad: nothing saved, nothing entered
    y = torch.relu(lin(x))  # linear saves x (a leaf input) and the weight: neither moves
    assert hooks.offloaded_bytes == 0
    y.sum().backward()
    out = lin(x)
    before = hooks.offloaded_bytes
    (out * out).sum().backward()  # `out * out` saves `out` outside the module's forward: not offloaded
    assert hooks.offloaded_bytes == before
    bad = torch.nn.Linear(8, 8)
    failing = enable_activation_offload(bad, "cpu")
    with pytest.raises(RuntimeError):
        bad(torch.randn(4, 3))
    assert not failing._active  # the forward hook ran on the exception: offloading stopped


def test_pack_round_trip():
    hooks = ActivationOffload(pin_memory=False)
    t = torch.randn(3, 4, requires_grad=True) * 2  # a non-leaf activation
    packed = hooks.pack(t)
    assert isinstance(packed, tuple) and hooks.offloaded_bytes == 3 * 4 * 4
    assert torch.equal(hooks.unpack(packed), t)
