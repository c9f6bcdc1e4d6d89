"""Device memory per phase of a PPO step, estimated from the model's config.json and the typed config.

Nothing is loaded: parameter counts come from the architecture (dense decoder: embeddings, attention,
gated MLP, norms), and every phase adds what lives on one device while it runs:

    gen           resident training state + the rollout engine's budget (gpu_memory_utilization x device)
    old_log_prob  resident state + one gathered FSDP unit set (the whole model with reshard_after_forward=false,
                  or with a wrap_policy.min_num_params above one layer's size)
                  + no-grad activations + response logits (+ float32 chunks off the Triton path)
    ref           the same with the reference's micro-batch
    update_actor  resident state + sharded fp32 grads + activations (checkpointed or not) + training logits

The resident state is what stays on the device between phases: fp32 master params (4 B / param / shard),
the optimizer's state (AdamW's two moments: 8 B; `optimizer_state_bytes`) unless offloaded, the frozen
reference in bf16 (2 B). Sharded over the FSDP size.
The caching allocator is emptied before the engine wakes, so the training peak is not carried into `gen`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

GIB = 2**30
# CUDA context, NCCL buffers and allocator slack per device process: measured contexts are 0.5-1 GiB.
OVERHEAD_BYTES = int(1.5 * GIB)
CHUNK_TOKENS = 4096  # rows of float32 (tokens, V) temporaries per step of the log-prob loop (workers/actor.py)


@dataclass(frozen=True)
class ModelShape:
    """What the estimate needs of a dense decoder-only config.json."""

    hidden: int
    layers: int
    vocab: int
    intermediate: int
    q_dim: int  # num_attention_heads x head_dim
    kv_dim: int  # num_key_value_heads x head_dim
    tied: bool
    qkv_bias: bool

    @classmethod
    def from_config_json(cls, cfg: dict) -> ModelShape:
        """From a HF config.json dict (`text_config` of a multimodal one).

        Raises:
            KeyError: a size the dense layout needs is missing. ValueError: a mixture-of-experts model.
        """
        cfg = cfg.get("text_config") or cfg
        if any(k in cfg for k in ("num_experts", "num_local_experts", "n_routed_experts")):
            raise ValueError("mixture-of-experts layers are not estimated")
        heads = cfg["num_attention_heads"]
        head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
        return cls(hidden=cfg["hidden_size"], layers=cfg["num_hidden_layers"], vocab=cfg["vocab_size"],
                   intermediate=cfg["intermediate_size"], q_dim=heads * head_dim,
                   kv_dim=cfg.get("num_key_value_heads", heads) * head_dim,
                   tied=bool(cfg.get("tie_word_embeddings", False)),
                   qkv_bias=bool(cfg.get("attention_bias", cfg.get("model_type") == "qwen2")))

    @property
    def layer_params(self) -> int:
        """Parameters of one decoder layer: q/k/v/o projections, gate/up/down, two norms."""
        h = self.hidden
        attn = h * self.q_dim + 2 * h * self.kv_dim + self.q_dim * h
        bias = self.q_dim + 2 * self.kv_dim if self.qkv_bias else 0
        return attn + bias + 3 * h * self.intermediate + 2 * h

    @property
    def root_params(self) -> int:
        """Embeddings, final norm and (untied) LM head: FSDP's root unit."""
        return self.vocab * self.hidden * (1 if self.tied else 2) + self.hidden

    @property
    def params(self) -> int:
        return self.root_params + self.layers * self.layer_params

    @property
    def act_bytes_per_token_layer(self) -> int:
        """bf16 activations autograd keeps per token and layer (SDPA: no seq x seq term): two RMSNorms
        (fp32 input + bf16 output), q/k/v before and after RoPE, attention output, o_proj output,
        gate/up/act/product of the MLP."""
        h, q, kv, i = self.hidden, self.q_dim, self.kv_dim, self.intermediate
        return 2 * (4 * h + 2 * h) + 2 * (q + 2 * kv) + 2 * (q + kv) + 2 * q + 2 * h + 8 * i


def load_shape(model_path: str) -> ModelShape:
    """`ModelShape` of the HF folder `model_path` (its config.json only)."""
    with open(os.path.join(os.path.expanduser(model_path), "config.json")) as f:
        return ModelShape.from_config_json(json.load(f))


@dataclass(frozen=True)
class TrainSetup:
    """One FSDP role as it runs on a device (the typed config's numbers, resolved by the caller).

    Attributes:
        shards: FSDP shard count. tokens_per_row: padded tokens of a row (prompt + response).
        logit_rows_per_row: positions of a row whose vocabulary logits are built (0: a value head).
    """

    shards: int
    tokens_per_row: int
    logit_rows_per_row: int
    checkpointing: bool
    param_offload: bool
    optimizer_offload: bool
    offload_policy: bool
    entropy: bool
    frozen: bool = False  # bf16 weights without an optimizer: the reference, or a LoRA actor's base
    gathered_pass: bool = False  # reshard_after_forward=false: every unit stays gathered through a pass
    unit_params: int = 0  # fsdp_config.wrap_policy.min_num_params (0: one FSDP unit per decoder layer)
    float32_chunks: bool = True  # the PyTorch log-prob path (CPU); False: the Triton kernels (CUDA)
    defer_grad_sync: bool = False  # use_no_sync_for_gradient_accumulation: unsharded grads until the last micro-batch
    chunk_tokens: int = CHUNK_TOKENS  # rows per float32 chunk (entropy_from_logits_chunk_size with chunking on)
    optim_bytes: float = 8.0  # optimizer state per parameter (`optimizer_state_bytes`)


def optimizer_state_bytes(optimizer: str, override: dict | None = None) -> float:
    """Bytes of state per fp32 parameter that torch keeps for the optimizer class `optimizer` with the constructor
    arguments `override`: Adam / AdamW two moments (8; 12 with amsgrad), an 8-bit Adam 2, SGD a momentum buffer
    (4) or none, Adagrad / RMSprop / Adadelta 4 (RMSprop 4 more per momentum or centred average). Another class
    counts as an Adam (8)."""
    name, extra = optimizer.lower(), dict(override or {})
    if "8bit" in name:
        return 2.0
    if name == "sgd":
        return 4.0 if float(extra.get("momentum", 0) or 0) else 0.0
    if name in ("adagrad", "adadelta"):
        return 4.0 if name == "adagrad" else 8.0
    if name == "rmsprop":
        return 4.0 + 4.0 * bool(extra.get("momentum")) + 4.0 * bool(extra.get("centered"))
    return 12.0 if extra.get("amsgrad") else 8.0


@dataclass
class PhaseEstimate:
    """Bytes per device of one phase, by part (for printing) and in total."""

    phase: str
    parts: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.parts.values())

    def line(self) -> str:
        parts = ", ".join(f"{k} {v / GIB:.2f}" for k, v in self.parts.items() if v)
        return f"  {self.phase:<13} {self.total / GIB:7.2f} GiB  ({parts})"


def resident_bytes(shape: ModelShape, s: TrainSetup) -> dict[str, int]:
    """Trainable role's state kept on the device between phases (nothing with offload_policy)."""
    if s.offload_policy:
        return {}
    p = shape.params / s.shards
    if s.frozen:  # bf16; a LoRA actor's adapters and their optimizer state are small
        return {} if s.param_offload else {"params": int(2 * p)}
    out = {} if s.param_offload else {"params": int(4 * p)}
    if not s.optimizer_offload:
        out["optimizer"] = int(s.optim_bytes * p)
    return out


def gathered_bytes(shape: ModelShape, whole: bool = False, unit_params: int = 0) -> int:
    """bf16 full copies during a forward: the root unit plus two decoder layers (the next one is prefetched), or
    with `whole` (reshard_after_forward=false) the whole model.

    Size-based wrapping (`unit_params` = wrap_policy.min_num_params) with a threshold above one layer's size
    wraps no layer on its own: their counts add up in their parent (never the layer list: fully_shard refuses a
    container without forward), so the decoder (or the root alone) is one unit, and the whole model is gathered
    at once (`rlpost.engine.fsdp.units_to_wrap`).
    """
    if whole or unit_params > shape.layer_params:
        return 2 * shape.params
    return 2 * (shape.root_params + 2 * shape.layer_params)


def forward_bytes(shape: ModelShape, rows: int, tokens_per_row: int, logit_rows_per_row: int,
                  whole: bool = False, float32_chunks: bool = True, unit_params: int = 0,
                  chunk_tokens: int = CHUNK_TOKENS) -> dict[str, int]:
    """No-grad forward of a micro-batch: gathered weights, one layer's activations, response logits
    (bf16) and, on the PyTorch log-prob path, the float32 chunk temporaries of its loop."""
    tokens = rows * tokens_per_row
    logit_rows = rows * logit_rows_per_row
    chunks = 3 * min(logit_rows, chunk_tokens) * shape.vocab * 4 if float32_chunks else 0
    return {"gathered": gathered_bytes(shape, whole, unit_params),
            "activations": tokens * shape.act_bytes_per_token_layer,
            "logits": logit_rows * shape.vocab * 2 + chunks}


def onloaded_bytes(shape: ModelShape, s: TrainSetup, with_optimizer: bool) -> dict[str, int]:
    """What an offloaded role brings back to the device for a phase (params; moments for an update)."""
    if s.offload_policy:
        return {}
    p = shape.params / s.shards
    out = {"params (onloaded)": int((2 if s.frozen else 4) * p)} if s.param_offload else {}
    if with_optimizer and s.optimizer_offload and not s.frozen:
        out["optimizer (onloaded)"] = int(s.optim_bytes * p)
    return out


def update_bytes(shape: ModelShape, s: TrainSetup, rows: int) -> dict[str, int]:
    """Training micro-batch: sharded fp32 grads (and, deferring the gradient sync, the unsharded fp32 ones), gathered
    weights (all of them with `gathered_pass`) and a
    unit set's bf16 grads, activations (all layers, or the checkpointed layer inputs plus one layer), logits
    (bf16 + their bf16 grad; on the PyTorch path also the saved float32 log-softmax (+ exp for entropy) and the
    float32 chunk temporaries of backward)."""
    tokens = rows * s.tokens_per_row
    per_layer = tokens * shape.act_bytes_per_token_layer
    acts = (shape.layers * tokens * shape.hidden * 2 + per_layer) if s.checkpointing else shape.layers * per_layer
    per_logit = 2 + 2 + ((4 + (4 if s.entropy else 0)) if s.float32_chunks else 0)
    logit_rows = rows * s.logit_rows_per_row
    chunks = 2 * min(logit_rows, s.chunk_tokens) * shape.vocab * 4 if s.float32_chunks else 0
    return {**onloaded_bytes(shape, s, with_optimizer=True),
            "grads": 0 if s.frozen else int(4 * shape.params / s.shards),
            # FSDP2 keeps them in the reduce dtype (fp32) until the sync
            "unsynced grads": 4 * shape.params if s.defer_grad_sync and not s.frozen and s.shards > 1 else 0,
            "gathered": (gathered_bytes(shape, s.gathered_pass, s.unit_params)
                         + gathered_bytes(shape, False, s.unit_params)),
            "activations": acts,
            "logits": logit_rows * shape.vocab * per_logit + chunks}


def fits(phases: list[PhaseEstimate], device_bytes: int) -> PhaseEstimate | None:
    """The first phase whose total plus the per-process overhead exceeds `device_bytes`, else None."""
    for ph in phases:
        if ph.total + OVERHEAD_BYTES > device_bytes:
            return ph
    return None
