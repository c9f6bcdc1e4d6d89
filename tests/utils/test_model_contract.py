"""The model-support contract: for every family in `rlpost.utils.tiny_families`, every training path gives every
row the log-probs, entropies and parameter gradients it gets when run alone and unpadded through the model's
reference (eager) attention — or start-up refuses that pair, naming the key.

Paths: padded, packed (use_remove_padding), packed with gradient checkpointing, dynamic batch size, the fused
LM head, entropy checkpointing, LoRA, Ulysses SP on 2 gloo ranks. float32 on CPU: values to 5e-5 nats, each
gradient tensor to 5e-5 of its largest entry. The outcome table is docs/model_support.md's; regenerate it with
`RLPOST_WRITE_MODEL_TABLE=1 python -m pytest tests/utils/test_model_contract.py`.
"""

from __future__ import annotations

import copy
import os
import sys
from pathlib import Path

import pytest
import torch

from _batches import varied_batch
from rlpost import keys
from rlpost.utils.model_traits import model_traits, path_refusals
from rlpost.utils.tiny_families import FAMILIES, family_config, family_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workers"))  # _fsdp_helpers.spawn

pytestmark = pytest.mark.timeout(600)

VOCAB = 96
TEMPERATURE = 0.7
VALUE_ATOL = 5e-5  # nats; a state or mask leaking across sequences moves values by 1e-3 .. 1e1
GRAD_TOL = 5e-5  # of each gradient tensor's largest entry
# Chunked linear attention (gated delta rule, reference implementation) sums in chunks whose boundaries move with
# the padding, so its float32 gradients differ from the row alone by rounding up to ~1.2e-4 of the largest entry
# (transformers 5.19); in float64 the same comparison holds to 1e-9 (test_linear_attention_padded_exact_in_float64).
GRAD_TOL_CHUNKED = {"qwen3_next": 2e-4, "qwen3_5": 2e-4}
PATHS = ("padded", "packed", "packed_checkpointing", "dynamic_bsz", "fused_head", "entropy_checkpointing", "lora",
         "ulysses")
DOC = Path(__file__).resolve().parents[2] / "docs" / "model_support.md"
_BEGIN, _END = "<!-- contract table: begin -->", "<!-- contract table: end -->"


def _stats(model, batch, rmpad: bool, fused: bool = False, checkpoint: bool = False, sp=None) -> torch.Tensor:
    """(B, R, 2) [log-prob, entropy] of the responses through the actor's forward."""
    from rlpost.engine.fused_logprob import FusedHeadOptions
    from rlpost.workers.actor import forward_response_logits, token_logp_entropy

    opts = FusedHeadOptions(TEMPERATURE, True, 4) if fused else None

    def fn(logits, labels):
        return token_logp_entropy(logits, labels, TEMPERATURE, True, chunk=4, checkpoint=checkpoint)

    return forward_response_logits(model, batch, rmpad, fn, sp, opts)


def _weights(batch) -> torch.Tensor:
    r = batch[keys.RESPONSES].shape
    return torch.linspace(-1.0, 1.0, r[0] * r[1] * 2).reshape(*r, 2) * batch[keys.RESPONSE_MASK][..., None]


def _grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad and p.grad is not None}


def per_row_truth(model, batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Each row alone, unpadded, positions 0.., no mask: its (R, 2) stats and the summed gradients of the weighted
    stats (the loss every path backpropagates)."""
    from rlpost.workers.actor import token_logp_entropy

    model.zero_grad(set_to_none=True)
    w = _weights(batch)
    r = batch[keys.RESPONSES].shape[1]
    out = torch.zeros(*batch[keys.RESPONSES].shape, 2)
    for i in range(out.shape[0]):
        real = batch[keys.ATTENTION_MASK][i].bool()
        ids = batch[keys.INPUT_IDS][i][real][None]
        n_resp = int(batch[keys.RESPONSE_MASK][i].sum())
        logits = model(input_ids=ids, use_cache=False).logits[0]
        n = ids.shape[1]
        # positions n - n_resp - 1 .. n - 2 predict the response tokens
        both = token_logp_entropy(logits[n - n_resp - 1:n - 1], ids[0, n - n_resp:], TEMPERATURE, True)
        (both * w[i, :n_resp]).sum().backward()
        out[i, :n_resp] = both.detach()
    assert out.shape[1] == r
    return out, _grads(model)


def _path_values(model, batch, path: str) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Stats and gradients of `batch` on a copy of `model` through `path` (not Ulysses)."""
    from rlpost.engine.packed_attention import use_packed_attention
    from rlpost.workers.batching import micro_batches

    m = copy.deepcopy(model)
    m.set_attn_implementation(model_traits(m.config).attn_implementation)
    if path != "padded":
        use_packed_attention(m)
    if path == "packed_checkpointing":
        m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    m.zero_grad(set_to_none=True)
    if path == "dynamic_bsz":
        micros, rev = micro_batches(batch, None, True, max_token_len=14)
        assert len(micros) > 1
        got = torch.cat([_stats(m, mb, True) for mb in micros])[rev]
    else:
        got = _stats(m, batch, path != "padded", fused=path == "fused_head",
                     checkpoint=path == "entropy_checkpointing")
    (got * _weights(batch)).sum().backward()
    return got.detach(), _grads(m)


def _with_lora(model):
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(1)
    targets = sorted({n.split(".")[-1] for n, mod in model.named_modules() if isinstance(mod, torch.nn.Linear)
                      and n.split(".")[-1] not in ("lm_head", "gate", "router")})
    return get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=targets, init_lora_weights=False))


def _close(got, want, grads, want_grads, where: str) -> None:
    mask = varied_batch(VOCAB, p=7, r=6)[keys.RESPONSE_MASK].bool()  # pad positions carry no value
    torch.testing.assert_close(got[mask], want[mask], atol=VALUE_ATOL, rtol=0, msg=lambda m: f"{where}: {m}")
    assert grads.keys() == want_grads.keys(), where
    for name, g in grads.items():
        # relative to the tensor's largest entry: float32 sums of O(1) terms in another order
        tol = GRAD_TOL_CHUNKED.get(where.split("/")[0], GRAD_TOL) * max(float(want_grads[name].abs().max()), 1e-3)
        torch.testing.assert_close(g, want_grads[name], atol=tol, rtol=0, msg=lambda m, n=name: f"{where} {n}: {m}")


def _refusal(name: str, path: str) -> str | None:
    traits = model_traits(family_config(name, VOCAB))
    why = path_refusals(traits, "actor_rollout_ref.model", use_remove_padding=path != "padded",
                        sp_key="actor_rollout_ref.actor.ulysses_sequence_parallel_size",
                        ulysses_size=2 if path == "ulysses" else 1, use_fused_kernels=path == "fused_head")
    return why[0] if why else None


_OUTCOMES: dict[tuple[str, str], str] = {}


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_every_path_equals_each_row_alone(name):
    batch = varied_batch(VOCAB, p=7, r=6)
    model = family_model(name, VOCAB)
    want, want_grads = per_row_truth(model, batch)
    for path in PATHS[:-1]:
        refused = _refusal(name, path)
        if refused:
            assert "set actor_rollout_ref." in refused
            _OUTCOMES[name, path] = "refused"
            continue
        if path == "lora":
            lora = _with_lora(copy.deepcopy(model))
            want_l, want_lg = per_row_truth(lora, batch)
            got, grads = _path_values(lora, batch, "packed")
            _close(got, want_l, grads, want_lg, f"{name}/lora")
            assert any("lora_B" in n for n in grads)
        else:
            got, grads = _path_values(model, batch, path)
            _close(got, want, grads, want_grads, f"{name}/{path}")
        _OUTCOMES[name, path] = "equal"


def _ulysses_rank(rank: int, names: list[str], out_dir: str) -> None:
    import torch.distributed as dist

    from rlpost.utils.distributed import init_distributed
    from rlpost.engine.packed_attention import use_packed_attention
    from rlpost.engine.ulysses import new_sequence_parallel, use_ulysses_attention

    init_distributed("cpu")
    sp = new_sequence_parallel(2)
    batch = varied_batch(VOCAB, p=7, r=6)
    lines = []
    for name in names:
        model = family_model(name, VOCAB)
        if _refusal(name, "ulysses"):
            use_packed_attention(model)
            with pytest.raises(NotImplementedError, match="not supported yet: ulysses_sequence_parallel_size"):
                use_ulysses_attention(model, 2)
            lines.append(f"{name} refused")
            continue
        want, want_grads = per_row_truth(model, batch)
        m = copy.deepcopy(model)
        m.set_attn_implementation(model_traits(m.config).attn_implementation)
        use_packed_attention(m)
        use_ulysses_attention(m, 2)
        got = _stats(m, batch, True, sp=sp)
        (got * _weights(batch)).sum().backward()
        grads = _grads(m)
        for g in grads.values():
            # the gather's backward scales by the group size for FSDP's average over the world: the group's sum
            # is twice the full gradient here
            dist.all_reduce(g, group=sp.group)
            g /= sp.size
        _close(got.detach(), want, grads, want_grads, f"{name}/ulysses")
        lines.append(f"{name} equal")
    if rank == 0:
        Path(out_dir, "ulysses.txt").write_text("\n".join(lines))


def test_ulysses_on_two_gloo_ranks_equals_each_row_alone(tmp_path):
    from _fsdp_helpers import spawn  # noqa: E402

    spawn(_ulysses_rank, (sorted(FAMILIES), str(tmp_path)), str(tmp_path))
    for line in (tmp_path / "ulysses.txt").read_text().splitlines():
        name, outcome = line.split()
        _OUTCOMES[name, "ulysses"] = outcome
    assert len([k for k in _OUTCOMES if k[1] == "ulysses"]) == len(FAMILIES)


def _vllm_cpu(name: str) -> str:
    """The vLLM (CPU) column: refused at start-up, or held to HF greedy after a sync by
    tests/rollout/test_vllm_families.py."""
    from rlpost.utils.model_traits import engine_refusal

    traits = model_traits(family_config(name, VOCAB, head_dim=64))
    return "refused" if engine_refusal(traits, "vllm", "cpu") else "greedy = HF after sync"


def render_table(outcomes: dict[tuple[str, str], str]) -> str:
    """The docs table of `outcomes` (family x path) plus the vLLM (CPU) column, with the reason of each refusal."""
    from rlpost.utils.model_traits import engine_refusal

    head = "| family | what it adds | " + " | ".join(PATHS) + " | vllm (CPU) |"
    rows = [head, "|" + "---|" * (len(PATHS) + 3)]
    for name in sorted(FAMILIES):
        cells = [outcomes.get((name, p), "?") for p in PATHS] + [_vllm_cpu(name)]
        rows.append(f"| {name} | {FAMILIES[name][1]} | " + " | ".join(cells) + " |")
    refusals = sorted({r for name in FAMILIES for p in PATHS if (r := _refusal(name, p))})
    refusals += sorted({r for name in FAMILIES
                        if (r := engine_refusal(model_traits(family_config(name, VOCAB, head_dim=64)), "vllm", "cpu"))})
    return "\n".join(rows + ["", "Refusals (start-up, before Ray):", *[f"- {r}" for r in refusals]])


def test_docs_table_matches_the_contract():
    """Runs after the two tests above (file order): docs/model_support.md shows what they found."""
    if len(_OUTCOMES) < len(FAMILIES) * len(PATHS):
        pytest.skip("the contract tests did not all run in this session")
    table = render_table(_OUTCOMES)
    text = DOC.read_text()
    if os.environ.get("RLPOST_WRITE_MODEL_TABLE") == "1":
        start, end = text.index(_BEGIN) + len(_BEGIN), text.index(_END)
        DOC.write_text(text[:start] + "\n" + table + "\n" + text[end:])
        text = DOC.read_text()
    assert table in text, ("docs/model_support.md is out of date; regenerate it: RLPOST_WRITE_MODEL_TABLE=1 "
                           "python -m pytest tests/utils/test_model_contract.py")


@pytest.mark.parametrize("name", sorted(GRAD_TOL_CHUNKED))
def test_linear_attention_padded_exact_in_float64(name, monkeypatch):
    """The wider float32 gradient tolerance of the chunked linear-attention families is rounding, not a leak: in
    float64 the padded path equals each row alone to 1e-9 in values and gradients."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    monkeypatch.setattr(sys.modules[__name__], "PATHS", ("padded",))
    monkeypatch.setattr(sys.modules[__name__], "VALUE_ATOL", 1e-9)
    monkeypatch.setattr(sys.modules[__name__], "GRAD_TOL", 1e-9)
    monkeypatch.setattr(sys.modules[__name__], "GRAD_TOL_CHUNKED", {})
    try:
        test_every_path_equals_each_row_alone(name)
    finally:
        torch.set_default_dtype(old)
