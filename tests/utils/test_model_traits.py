"""Architecture traits read from HF configs, and the start-up refusals they lead to."""

import pytest

from rlpost.utils.model_traits import engine_refusal, model_traits, path_refusals
from rlpost.utils.tiny_families import family_config

GROUP, SP = "actor_rollout_ref.model", "actor_rollout_ref.actor.ulysses_sequence_parallel_size"


@pytest.mark.parametrize("name, want", [
    ("llama", dict(linear_attention=False, sliding_window=None, mla=False, experts=0, sinks=False)),
    ("qwen3_moe", dict(experts=4, mla=False)),
    ("qwen3_next", dict(linear_attention=True, experts=4)),
    ("qwen3_5", dict(linear_attention=True, experts=0)),
    ("deepseek_v3", dict(mla=True, experts=4)),
    ("gemma2", dict(sliding_window=4, attn_softcap=5.0, logit_transform="final_logit_softcapping")),
    ("gemma3", dict(sliding_window=4, attn_softcap=None, logit_transform=None)),
    ("mistral", dict(sliding_window=4)),
    ("gpt_oss", dict(sinks=True, sliding_window=4, experts=4)),
])
def test_traits_of_each_family(name, want):
    traits = model_traits(family_config(name, 64))
    for field, value in want.items():
        assert getattr(traits, field) == value, (name, field)
    assert traits.other_layers == ()


def test_eager_attention_where_sdpa_drops_a_term():
    assert model_traits(family_config("gemma2", 64)).attn_implementation == "eager"  # soft-capping
    assert model_traits(family_config("gpt_oss", 64)).attn_implementation == "eager"  # sinks
    assert model_traits(family_config("mistral", 64)).attn_implementation == "sdpa"  # SDPA's mask holds the window


def test_recurrent_models_are_refused_on_packed_rows_and_under_ulysses():
    from transformers import MambaConfig

    traits = model_traits(MambaConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2))
    assert traits.other_layers == ("mamba",)
    why = path_refusals(traits, GROUP, use_remove_padding=True, sp_key=SP, ulysses_size=2, use_fused_kernels=False)
    assert len(why) == 2
    assert why[0].startswith(f"{GROUP}.use_remove_padding=true: a mamba model has mamba layers")
    assert why[0].endswith(f"set {GROUP}.use_remove_padding=false")
    assert why[1].endswith(f"set {SP}=1")
    assert path_refusals(traits, GROUP, False, SP, 1, False) == []


def test_engine_refusals_name_the_engine_the_device_and_the_family():
    next_traits = model_traits(family_config("qwen3_next", 64))
    assert "qwen3_next model" in engine_refusal(next_traits, "vllm", "cpu")
    assert engine_refusal(next_traits, "vllm", "cuda") is None
    assert engine_refusal(next_traits, "hf", "cpu") is None
    assert engine_refusal(model_traits(family_config("qwen3_moe", 64)), "vllm", "cpu") is None


def test_router_replay_is_refused_for_models_it_does_not_cover():
    from rlpost.utils.model_traits import replay_refusal

    assert replay_refusal(model_traits(family_config("qwen3_moe", 64)), "R2") is None
    assert replay_refusal(model_traits(family_config("qwen3_next", 64)), "R2") is None
    assert replay_refusal(model_traits(family_config("llama", 64)), "disabled") is None
    dense = replay_refusal(model_traits(family_config("llama", 64)), "R2")
    assert "a llama model is dense" in dense and dense.endswith("set actor_rollout_ref.actor.router_replay.mode=disabled")
    assert "routes its experts in a way" in replay_refusal(model_traits(family_config("deepseek_v3", 64)), "R2")


def test_qwen3_5_moe_routers_are_covered_through_its_text_config():
    """A Qwen3.5-MoE config's text part calls itself qwen3_5_moe_text: replay and the load metrics take it."""
    from transformers import Qwen3_5MoeConfig

    from rlpost.utils.model_traits import load_metrics_refusal, replay_refusal

    traits = model_traits(Qwen3_5MoeConfig())
    assert traits.model_type == "qwen3_5_moe_text" and traits.experts > 0
    assert replay_refusal(traits, "R2") is None and load_metrics_refusal(traits, 1) is None
    assert "is dense" in load_metrics_refusal(model_traits(family_config("llama", 64)), 1)
