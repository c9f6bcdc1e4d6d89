"""The vLLM CPU engine serving a LoRA adapter handed over in memory (`VLLMRollout.load_adapter_tensors`) against the
same adapter read from a PEFT folder (`load_adapter`), on one real engine: equal greedy outputs, unlike the base
model's, and a later hand-over with other weights is what the engine serves (no cached older adapter)."""

import pytest
import torch

from _compose import SMALL, compose_config
from rlpost import keys

R = 4
RANK = 8
PROMPTS = ["What is 12 + 7?", "system\nYou are"]


def _adapter(model_dir: str, seed: int):
    """(PEFT-named adapter tensors, LoraConfig) of a rank-8 all-linear adapter with large random A and B."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from rlpost.engine.lora import adapter_tensors

    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    cfg = LoraConfig(r=RANK, lora_alpha=2 * RANK, target_modules="all-linear", lora_dropout=0.0, bias="none",
                     task_type="CAUSAL_LM")
    model = get_peft_model(base, cfg).base_model.model
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    return adapter_tensors(model.state_dict().items()), cfg


def _copy(tensors: dict) -> dict:
    return {k: v.clone() for k, v in tensors.items()}


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    from transformers import AutoTokenizer

    from rlpost.rollout import build_rollout

    tok = AutoTokenizer.from_pretrained(tiny_model_dir, padding_side="left")
    cfg = compose_config(*SMALL, "actor_rollout_ref.rollout.name=vllm", "trainer.device=cpu",
                         "actor_rollout_ref.rollout.dtype=float32", "data.max_prompt_length=32",
                         f"data.max_response_length={R}", "actor_rollout_ref.rollout.ignore_eos=true",
                         "actor_rollout_ref.rollout.max_num_batched_tokens=1024",
                         "actor_rollout_ref.rollout.max_num_seqs=32").actor_rollout_ref.rollout
    rollout = build_rollout(cfg, tiny_model_dir, tok, "cpu", lora_rank=RANK)
    enc = tok(PROMPTS, return_tensors="pt", padding=True)
    from rlpost.protocol import DataProto

    data = DataProto.from_dict(
        tensors={keys.INPUT_IDS: enc.input_ids, keys.ATTENTION_MASK: enc.attention_mask,
                 keys.POSITION_IDS: (enc.attention_mask.cumsum(-1) - 1).clamp(min=0)},
        meta_info={keys.META_EOS_TOKEN_ID: tok.eos_token_id, keys.META_PAD_TOKEN_ID: tok.pad_token_id,
                   "do_sample": False})
    return rollout, lambda: rollout.generate_sequences(data).batch[keys.RESPONSES].tolist()


@pytest.mark.timeout(300)
def test_in_memory_adapter_equals_folder_adapter_and_a_new_one_replaces_it(engine, tiny_model_dir, tmp_path):
    from rlpost.engine.lora import save_adapter

    rollout, greedy = engine
    base = greedy()  # no adapter served yet
    tensors, cfg = _adapter(tiny_model_dir, seed=0)
    rollout.load_adapter(save_adapter(str(tmp_path / "a"), tensors, cfg))
    from_folder = greedy()
    assert from_folder != base  # the adapter changes greedy output: the comparisons below mean something
    assert rollout.load_adapter_tensors(_copy(tensors), cfg)  # the engine takes the tensors over: copies
    assert rollout.lora_request.lora_path.startswith("rlpost-memory://")
    assert greedy() == from_folder

    other, _ = _adapter(tiny_model_dir, seed=1)  # a second hand-over (the next step's weights)
    assert rollout.load_adapter_tensors(_copy(other), cfg)
    served = greedy()
    rollout.load_adapter(save_adapter(str(tmp_path / "b"), other, cfg))
    assert served == greedy() != from_folder


@pytest.mark.timeout(120)
def test_in_memory_hand_over_checks_target_modules(engine, tiny_model_dir):
    rollout, _ = engine
    tensors, cfg = _adapter(tiny_model_dir, seed=0)
    name = next(k for k in tensors if "q_proj.lora_A" in k)
    bad = {**tensors, name.replace("q_proj", "not_a_layer"): tensors[name]}
    with pytest.raises(Exception, match="not_a_layer"):
        rollout.load_adapter_tensors(bad, cfg)



@pytest.mark.timeout(120)
def test_bench_lora_sync_times_both_ways_and_leaves_the_adapter_served(engine, tiny_model_dir, tmp_path):
    from benchmarks.bench_lora_sync import adapter, hand_over_times

    rollout, greedy = engine
    tensors, cfg = adapter(tiny_model_dir, RANK, torch.float32)  # the bench's adapter: small random A and B
    times = hand_over_times(rollout, tensors, cfg, reps=1, folder=str(tmp_path / "f"))
    assert {k: len(v) for k, v in times.items()} == {"folder": 1, "memory": 1} and min(map(min, times.values())) > 0
    # round 2 ran folder then memory: the engine serves the in-memory copy, equal to the folder's adapter
    assert rollout.lora_request.lora_path.startswith("rlpost-memory://")
    served = greedy()
    rollout.load_adapter(str(tmp_path / "f"))
    assert greedy() == served
