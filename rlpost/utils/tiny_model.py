"""Build a tiny Qwen2-architecture model and a byte-level BPE tokenizer, offline, in seconds.

Tests, examples and the quickstart use it instead of a model hub. head_dim is 64 because the CPU
attention of vLLM rejects smaller heads (ENVIRONMENT.md).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any, Iterable

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# Qwen2.5-style ChatML template: `add_generation_prompt` opens the assistant turn; with `tools=` the tool schemas
# go into the system turn and consecutive tool messages become one user turn of <tool_response> blocks.
# Without tools and tool messages it renders exactly `<|im_start|>{role}\n{content}<|im_end|>\n` per message. A
# message without a role renders nothing (Qwen2.5's renders `[{}]` as its default system turn; this one has none).
CHAT_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}"
    "{{- '\\n</tools>\\nCall a tool with <tool_call>{\"name\": ..., \"arguments\": {...}}</tool_call><|im_end|>\\n' }}"
    "{%- elif messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message['role'] is not defined or (message['role'] == 'system' and loop.first) %}"
    "{%- elif message['role'] == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message['content'] + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def default_corpus(num_lines: int = 4000, seed: int = 0) -> list[str]:
    """Arithmetic question/answer text plus chat markup, enough for a small BPE vocabulary."""
    rng = random.Random(seed)
    lines = []
    for _ in range(num_lines):
        a, b = rng.randint(0, 999), rng.randint(0, 999)
        op = rng.choice(["+", "-", "*"])
        val = {"+": a + b, "-": a - b, "*": a * b}[op]
        lines.append(f"user\nWhat is {a} {op} {b}? Answer with #### followed by the number.\n")
        lines.append(f"assistant\n{a} {op} {b} = {val}. #### {val}\n")
        lines.append(f"assistant\n#### {val}\n")
    lines.append("system\nYou are a helpful assistant. Let's think step by step. The answer is\n")
    return lines


def build_tokenizer(out_dir: str | Path, corpus: Iterable[str] | None = None, vocab_size: int = 512):
    """Train a byte-level BPE tokenizer and save it as a transformers `PreTrainedTokenizerFast` folder."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    # One token per digit keeps numbers consistently tokenised, which small arithmetic models need.
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(corpus if corpus is not None else default_corpus()), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        unk_token=None,
        additional_special_tokens=["<|im_start|>"],
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.padding_side = "left"
    fast.save_pretrained(str(out_dir))
    return fast


def build_tiny_model(
    out_dir: str | Path,
    corpus: Iterable[str] | None = None,
    vocab_size: int = 512,
    hidden_size: int = 128,
    num_layers: int = 2,
    num_heads: int = 2,
    num_kv_heads: int = 1,
    intermediate_size: int = 256,
    max_position_embeddings: int = 4096,
    seed: int = 0,
    with_value_head: bool = False,
    arch: str = "qwen2",
) -> Path:
    """Save tokenizer + randomly initialised causal LM (float32) into `out_dir`; return it.

    `arch` "qwen2" is the default tiny Qwen2; any other name is a family of `rlpost.utils.tiny_families`
    (qwen3_moe, qwen3_next, deepseek_v3, ...) at this head size, its family-specific layers kept.
    """
    import torch
    from transformers import AutoModelForCausalLM, Qwen2ForCausalLM

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(out, corpus, vocab_size)
    torch.manual_seed(seed)
    if hidden_size // num_heads != 64:
        raise ValueError(f"head_dim must be 64 for vLLM's CPU attention, got {hidden_size // num_heads}")
    if arch != "qwen2":
        from rlpost.utils.tiny_families import family_config

        config = family_config(arch, len(tok), head_dim=hidden_size // num_heads, num_heads=num_heads,
                               num_kv_heads=num_kv_heads, num_layers=num_layers, initializer_range=0.02,
                               intermediate_size=intermediate_size, tie_word_embeddings=True,
                               bos_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                               pad_token_id=tok.pad_token_id, max_position_embeddings=max_position_embeddings)
        model = AutoModelForCausalLM.from_config(config).float()
    else:
        model = Qwen2ForCausalLM(_qwen2_config(tok, hidden_size, intermediate_size, num_layers, num_heads,
                                               num_kv_heads, max_position_embeddings))
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(str(out), safe_serialization=True)
    return out


def _qwen2_config(tok: Any, hidden_size: int, intermediate_size: int, num_layers: int, num_heads: int,
                  num_kv_heads: int, max_position_embeddings: int) -> Any:
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=len(tok),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=hidden_size // num_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        torch_dtype="float32",
    )
