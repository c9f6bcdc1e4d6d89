"""The model-support contract on CUDA in bf16: the packed path (PyTorch's varlen flash kernel where it applies:
windows through its window_size, MLA / soft-capping / sinks through the per-sequence formula) is as close to the
truth (each row alone through the family's eager attention in float32) as bf16 rows run alone are: its mean error
over the response tokens at most twice theirs plus 0.01 nats, its gradients' relative error at most twice theirs
plus 0.02 (bf16 rounds the same maths differently in every kernel, so bf16 against bf16 would measure rounding). Also runs as a script
(`python tests/gpu/test_model_contract_gpu.py`) on a host without pytest; prints one line per family.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "utils"))  # _batches
from _batches import varied_batch  # noqa: E402

from rlpost import keys  # noqa: E402
from rlpost.utils.model_traits import model_traits  # noqa: E402
from rlpost.utils.tiny_families import FAMILIES, family_model  # noqa: E402

VOCAB = 512
FAMILY_NAMES = sorted(FAMILIES)


def _stats(model, batch, rmpad: bool) -> torch.Tensor:
    from rlpost.workers.actor import forward_response_logits, token_logp_entropy

    return forward_response_logits(model, batch, rmpad, lambda lg, lb: token_logp_entropy(lg, lb, 1.0, True,
                                                                                         kernel="torch"))


def _rows_alone(model, batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    from rlpost.workers.actor import token_logp_entropy

    model.zero_grad(set_to_none=True)
    out = torch.zeros(*batch[keys.RESPONSES].shape, 2, device="cuda")
    for i in range(out.shape[0]):
        ids = batch[keys.INPUT_IDS][i][batch[keys.ATTENTION_MASK][i].bool()][None]
        n, r = ids.shape[1], int(batch[keys.RESPONSE_MASK][i].sum())
        logits = model(input_ids=ids, use_cache=False).logits[0]
        both = token_logp_entropy(logits[n - r - 1:n - 1], ids[0, n - r:], 1.0, True, kernel="torch")
        both.sum().backward()
        out[i, :r] = both.detach()
    return out, {k: p.grad.float().clone() for k, p in model.named_parameters() if p.grad is not None}


def _grad_err(grads: dict[str, torch.Tensor], truth: dict[str, torch.Tensor]) -> float:
    return max(float((g - truth[k]).norm() / truth[k].norm().clamp(min=1e-6)) for k, g in grads.items())


def check_family(name: str) -> str:
    from rlpost.engine.packed_attention import use_packed_attention

    batch = {k: v.cuda() for k, v in varied_batch(VOCAB, p=48, r=40).items()}
    model = family_model(name, VOCAB, head_dim=64, num_heads=4, num_kv_heads=2, initializer_range=0.1).cuda()
    truth, truth_grads = _rows_alone(model, batch)  # float32
    model = model.to(torch.bfloat16)
    bf16_rows, bf16_grads = _rows_alone(model, batch)
    packed = copy.deepcopy(model)
    packed.set_attn_implementation(model_traits(packed.config).attn_implementation)
    use_packed_attention(packed)
    packed.zero_grad(set_to_none=True)
    got = _stats(packed, batch, True)
    (got.float() * batch[keys.RESPONSE_MASK][..., None]).sum().backward()
    mask = batch[keys.RESPONSE_MASK].bool()
    # mean over tokens: an MoE token whose top-k flips in bf16 (either path) moves the max, not the mean
    rows_err = float((bf16_rows - truth)[mask].abs().mean())
    packed_err = float((got.detach().float() - truth)[mask].abs().mean())
    rows_grad = _grad_err(bf16_grads, truth_grads)
    packed_grad = _grad_err({k: p.grad.float() for k, p in packed.named_parameters() if p.grad is not None},
                            truth_grads)
    line = (f"{name}: mean |diff| to float32 rows alone: packed bf16 {packed_err:.4f}, bf16 rows alone "
            f"{rows_err:.4f}; max grad rel. err: packed {packed_grad:.4f}, rows alone {rows_grad:.4f}")
    assert packed_err <= 2 * rows_err + 0.01, line
    assert packed_grad <= 2 * rows_grad + 0.02, line
    return line


def test_every_family_on_the_packed_cuda_path_equals_each_row_alone():
    for name in FAMILY_NAMES:
        print(check_family(name))


if __name__ == "__main__":
    failed = 0
    for family in FAMILY_NAMES:
        try:
            print(check_family(family), flush=True)
        except Exception as exc:  # noqa: BLE001 - report every family, then fail
            failed += 1
            print(f"{family}: FAILED {exc!r}", flush=True)
    sys.exit(1 if failed else 0)
