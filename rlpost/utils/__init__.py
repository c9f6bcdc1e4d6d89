"""Shared utilities. `hf_tokenizer` / `hf_processor` are importable from here as in verl."""

from typing import Any


def __getattr__(name: str) -> Any:
    # Lazy: importing rlpost.utils must not import transformers.
    if name in ("hf_tokenizer", "hf_processor"):
        from rlpost.utils import tokenizer

        return getattr(tokenizer, name)
    raise AttributeError(f"module 'rlpost.utils' has no attribute {name!r}")
