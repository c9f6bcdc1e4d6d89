"""Fixtures of the agent tests: the tiny BPE tokenizer with a ChatML template that lists tools and groups
tool results into one user turn (as Qwen2.5's does), and the tiny model's own tokenizer with it."""

import pytest

# ChatML with tools: the tool schemas go into the system turn; consecutive tool messages become one user
# turn of <tool_response> blocks.
TOOLS_CHAT_TEMPLATE = (
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
    "{%- if message['role'] == 'system' and loop.first %}"
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
