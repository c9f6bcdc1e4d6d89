"""Fixtures of the agent tests: the tiny BPE tokenizer with a ChatML template that lists tools and groups
tool results into one user turn (as Qwen2.5's does), and the tiny model's own tokenizer with it."""

import pytest

from rlpost.utils.tiny_model import CHAT_TEMPLATE

# The tiny model's own template: ChatML that lists tools and groups tool results into one user turn.
TOOLS_CHAT_TEMPLATE = CHAT_TEMPLATE

# The same, but assistant content is trimmed: a model turn that starts with whitespace re-renders without it.
TRIMMING_CHAT_TEMPLATE = TOOLS_CHAT_TEMPLATE.replace(
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}",
    "{{- '<|im_start|>' + message['role'] + '\\n' + (message['content'] | trim) + '<|im_end|>\\n' }}",
)


@pytest.fixture(scope="session")
def chat_tokenizer(tiny_model_dir):
    """The tiny model's tokenizer (byte-level BPE, digits split) with TOOLS_CHAT_TEMPLATE."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tok.chat_template = TOOLS_CHAT_TEMPLATE
    return tok


@pytest.fixture(scope="session")
def trimming_tokenizer(tiny_model_dir):
    """The tiny model's tokenizer with TRIMMING_CHAT_TEMPLATE."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tok.chat_template = TRIMMING_CHAT_TEMPLATE
    return tok


@pytest.fixture(scope="module")
def vllm_engine(tiny_model_dir):
    """(agent front of a vLLM CPU rollout whose weights are perturbed so greedy text varies, tokenizer).

    One per file: vLLM's parallel groups are per process, and another in-process engine that a later file of
    the same xdist process builds and drops (benchmarks/lora_limits.py's bare `LLM`) takes them down with it."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from _compose import SMALL, compose_config

    from rlpost.rollout import build_rollout

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    cfg = compose_config(*SMALL, "actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.dtype=float32",
                         "data.max_prompt_length=64", "data.max_response_length=80",
                         "actor_rollout_ref.rollout.calculate_log_probs=true").actor_rollout_ref.rollout
    rollout = build_rollout(cfg, tiny_model_dir, tok, "cpu")
    actor = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in actor.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.5)
    rollout.update_weights(actor.named_parameters())
    return rollout.agent_engine({tok.eos_token_id}), tok
