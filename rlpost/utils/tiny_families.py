"""Tiny random models of today's architecture families, built offline from transformers' own config classes.

Each family keeps the feature that makes it different (hybrid linear attention, MLA, routed experts, sliding
windows, soft-capping, attention sinks) at a size that runs in milliseconds on a CPU. The model-support
contract (tests/utils/test_model_contract.py) runs every training path over this table; `make_tiny_model.py
--arch NAME` saves one with a tokenizer for `main_ppo`.

    config = family_config("qwen3_next", vocab_size=128)            # the contract's size (head_dim 16)
    config = family_config("qwen3_moe", vocab_size=512, head_dim=64)  # vLLM's CPU attention needs head_dim 64
"""

from __future__ import annotations

from typing import Any, Callable


def _moe(**extra: Any) -> dict[str, Any]:
    return {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32, **extra}


def _routed(**extra: Any) -> dict[str, Any]:  # DeepSeek / GLM naming
    # topk_method as the released DeepSeek-V3 / GLM-4.5 configs write it (vLLM builds the routing bias from it)
    return {"n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "first_k_dense_replace": 1,
            "n_group": 1, "topk_group": 1, "topk_method": "noaux_tc", **extra}


def _linear(head_dim: int) -> dict[str, Any]:
    return {"linear_num_value_heads": 4, "linear_num_key_heads": 2, "linear_key_head_dim": head_dim,
            "linear_value_head_dim": head_dim}


# name -> (transformers config class name, what the family adds, extra config fields given the head size)
FAMILIES: dict[str, tuple[str, str, Callable[[int], dict[str, Any]]]] = {
    "llama": ("LlamaConfig", "dense, GQA", lambda d: {}),
    "qwen2": ("Qwen2Config", "dense, GQA, q/k/v bias", lambda d: {}),
    "qwen3": ("Qwen3Config", "dense, q/k norm", lambda d: {}),
    "qwen3_moe": ("Qwen3MoeConfig", "routed experts", lambda d: _moe(decoder_sparse_step=1)),
    "qwen3_next": ("Qwen3NextConfig", "Gated DeltaNet linear attention + full attention, experts",
                   lambda d: {"num_hidden_layers": 4, "full_attention_interval": 2,
                              "shared_expert_intermediate_size": 32, **_moe(), **_linear(d)}),
    "qwen3_5": ("Qwen3_5TextConfig", "Gated DeltaNet linear attention + full attention (Qwen3.5 layout)",
                lambda d: {"num_hidden_layers": 4, **_linear(d)}),
    "deepseek_v3": ("DeepseekV3Config", "MLA (q/k head 24, v head 16) + routed and shared experts",
                    lambda d: {"num_key_value_heads": 4, "head_dim": None, "q_lora_rank": 32,
                               # vLLM MLA takes latent + rope of 320, 512 or 576
                               "kv_lora_rank": 16 if d < 64 else 320 - d // 2,
                               "qk_nope_head_dim": d, "qk_rope_head_dim": d // 2, "v_head_dim": d, **_routed()}),
    "glm4_moe": ("Glm4MoeConfig", "routed and shared experts, partial rotary (GLM-4.5)", lambda d: _routed()),
    "gemma2": ("Gemma2Config", "sliding window every other layer, attention and final logit soft-capping",
               lambda d: {"sliding_window": 4, "attn_logit_softcapping": 5.0, "final_logit_softcapping": 3.0}),
    "gemma3": ("Gemma3TextConfig", "sliding window (5:1 pattern shortened to 1:1), q/k norm",
               lambda d: {"sliding_window": 4, "sliding_window_pattern": 2}),
    "mistral": ("MistralConfig", "sliding window on every layer", lambda d: {"sliding_window": 4}),
    "gpt_oss": ("GptOssConfig", "attention sinks, sliding window every other layer, experts",
                lambda d: {"num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": 4}),
    "phi3": ("Phi3Config", "fused qkv / gate-up projections",
             lambda d: {"pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 2}),
}


def family_config(name: str, vocab_size: int, head_dim: int = 16, num_heads: int = 4, num_kv_heads: int = 2,
                  num_layers: int = 2, initializer_range: float = 0.2, **overrides: Any) -> Any:
    """transformers config of a tiny `name` model.

    Args:
        initializer_range: weight init scale; larger than the families' 0.02 so that attention is peaked and a
            wrong mask or a missing term changes the numbers (near-uniform attention would hide it).
        overrides: further config fields (token ids, dtype, ...).
    """
    import transformers

    if name not in FAMILIES:
        raise ValueError(f"unknown family {name!r}; choose one of {sorted(FAMILIES)}")
    cls_name, _, extra = FAMILIES[name]
    fields: dict[str, Any] = {"vocab_size": vocab_size, "hidden_size": head_dim * num_heads,
                              "intermediate_size": 96, "num_hidden_layers": num_layers,
                              "num_attention_heads": num_heads, "num_key_value_heads": num_kv_heads,
                              "head_dim": head_dim, "max_position_embeddings": 4096, "tie_word_embeddings": False,
                              "initializer_range": initializer_range, **extra(head_dim), **overrides}
    fields = {k: v for k, v in fields.items() if v is not None}
    return getattr(transformers, cls_name)(**fields)


def family_model(name: str, vocab_size: int, seed: int = 0, **kwargs: Any) -> Any:
    """A float32 random `name` causal LM (eager attention: the families' reference formula), in train mode."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(family_config(name, vocab_size, **kwargs), attn_implementation="eager")
    return model.float().train()
