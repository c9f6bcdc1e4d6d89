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
