"""Model merger: per-rank dim-0 shards of a tiny model -> HF folder whose logits match the original."""

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from rlpost.checkpoint.format import META_FILE, REPLICATE, SHARD, build_fsdp_meta, save_fsdp_meta, shard_file
from rlpost.checkpoint.merger import gather_shard0, load_full_state, main


def write_shards(model: torch.nn.Module, src_dir: str, out: Path, world: int, with_meta: bool = True) -> Path:
    """Save `model` as `world` ranks would: torch.chunk along dim 0 (empty tensors for ranks without rows)."""
    out.mkdir(parents=True)
    state = model.state_dict()
    per_rank: list[dict] = [{} for _ in range(world)]
    for name, tensor in state.items():
        chunks = torch.chunk(tensor, world, dim=0) if tensor.dim() else [tensor] * world
        for rank in range(world):
            empty = tensor.new_empty((0, *tensor.shape[1:]))
            per_rank[rank][name] = chunks[rank].clone() if rank < len(chunks) else empty
    for rank, shard in enumerate(per_rank):
        torch.save(shard, shard_file(out, world, rank))
    if with_meta:
        meta = build_fsdp_meta(state, world, model_class="FSDP" + type(model).__name__)
        for name, tensor in state.items():  # plain tensors read as Replicate(); FSDP2 params are Shard(0)
            meta["params"][name]["placement"] = SHARD if tensor.dim() else REPLICATE
        save_fsdp_meta(out, meta)
    hf = out / "huggingface"
    hf.mkdir()
    for f in Path(src_dir).iterdir():
        if not f.name.endswith(".safetensors"):
            shutil.copy2(f, hf / f.name)
    return out


@pytest.fixture(scope="module")
def tiny_lm(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()


def test_gather_shard0_uneven_and_empty_ranks():
    full = torch.arange(10.0).reshape(5, 2)
    pieces = list(torch.chunk(full, 4)) + [full[:0]]  # chunk gives 3 pieces of 2,2,1 rows: ranks 3 is empty
    assert [p.shape[0] for p in pieces[:4]] == [2, 2, 1, 0]
    assert torch.equal(gather_shard0(pieces[:4], [5, 2], "w"), full)
    with pytest.raises(ValueError, match=r"w: rank 1 holds shape \[1, 2\], expected \[2"):
        gather_shard0([full[:2], full[2:3], full[3:5], full[:0]], [5, 2], "w")


def test_build_fsdp_meta_reads_dtensor_placements():
    shard0 = SimpleNamespace(is_shard=lambda d: d == 0, is_replicate=lambda: False)
    fake = SimpleNamespace(shape=torch.Size([6, 4]), dtype=torch.bfloat16, placements=(shard0,))
    meta = build_fsdp_meta({"a": fake, "b": torch.zeros(3)}, world_size=2, model_class="FSDPQwen2ForCausalLM")
    assert meta["model_class"] == "Qwen2ForCausalLM" and meta["world_size"] == 2
    assert meta["params"]["a"] == {"shape": [6, 4], "placement": SHARD, "dtype": "bfloat16"}
    assert meta["params"]["b"]["placement"] == REPLICATE


@pytest.mark.timeout(120)
def test_merge_roundtrip_logits_match(tiny_lm, tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    local = write_shards(tiny_lm, tiny_model_dir, tmp_path / "actor", world=3)
    meta = json.loads((local / META_FILE).read_text())
    vocab = tiny_lm.config.vocab_size
    assert meta["params"]["model.embed_tokens.weight"]["shape"] == [vocab, 128]
    assert torch.load(shard_file(local, 3, 2))["model.embed_tokens.weight"].shape[0] == vocab - 2 * -(-vocab // 3)

    target = tmp_path / "hf"
    assert main(["merge", "--backend", "fsdp", "--local_dir", str(local), "--target_dir", str(target)]) == 0
    assert (target / "model.safetensors").exists() and (target / "tokenizer.json").exists()
    merged = AutoModelForCausalLM.from_pretrained(target).eval()
    tok = AutoTokenizer.from_pretrained(target)
    ids = torch.tensor([tok.encode("What is 12 + 30? Answer with #### 42")])
    with torch.no_grad():
        diff = (merged(ids).logits - tiny_lm(ids).logits).abs().max().item()
    assert diff == 0.0

    assert main(["test", "--local_dir", str(local), "--test_hf_dir", str(target)]) == 0
    bad = tmp_path / "bad"
    shutil.copytree(target, bad)
    from safetensors.torch import load_file, save_file

    weights = load_file(str(bad / "model.safetensors"))
    weights["model.norm.weight"] = weights["model.norm.weight"] + 0.5
    save_file(weights, str(bad / "model.safetensors"), metadata={"format": "pt"})
    assert main(["test", "--local_dir", str(local), "--test_hf_dir", str(bad)]) == 1


def test_merge_without_meta_and_bf16(tiny_lm, tiny_model_dir, tmp_path):
    from safetensors.torch import load_file

    local = write_shards(tiny_lm, tiny_model_dir, tmp_path / "actor", world=2, with_meta=False)
    state = load_full_state(local)
    assert torch.equal(state["model.layers.0.mlp.up_proj.weight"], tiny_lm.state_dict()["model.layers.0.mlp.up_proj.weight"])
    target = tmp_path / "hf16"
    assert main(["merge", "--local_dir", str(local), "--target_dir", str(target), "--dtype", "bfloat16"]) == 0
    assert load_file(str(target / "model.safetensors"))["model.norm.weight"].dtype == torch.bfloat16


def test_merge_critic_value_head(tiny_model_dir, tmp_path):
    from transformers import AutoModelForTokenClassification

    critic = AutoModelForTokenClassification.from_pretrained(tiny_model_dir, num_labels=1).eval()
    local = write_shards(critic, tiny_model_dir, tmp_path / "critic", world=2, with_meta=False)
    target = tmp_path / "hf_critic"
    assert main(["merge", "--local_dir", str(local), "--target_dir", str(target)]) == 0
    merged = AutoModelForTokenClassification.from_pretrained(target).eval()
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        assert torch.equal(merged(ids).logits, critic(ids).logits)
    assert merged(ids).logits.shape == (1, 4, 1)


def test_errors(tmp_path):
    (tmp_path / "model_world_size_2_rank_0.pt").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match="missing shard files"):
        load_full_state(tmp_path)
    with pytest.raises(SystemExit, match="not supported yet: --backend megatron"):
        main(["merge", "--backend", "megatron", "--local_dir", str(tmp_path), "--target_dir", str(tmp_path / "o")])

