"""verl's `hf_tokenizer` / `hf_processor`: load a tokenizer (pad token set) or a multimodal processor."""

from __future__ import annotations

import os
import sys
import warnings
from typing import Any


def auto_tokenizer() -> Any:
    """`transformers.AutoTokenizer`, imported without scikit-learn.

    The import loads transformers' generation utilities, which import scikit-learn when it is installed (and
    with it SciPy's statistics and pandas: seconds in every process that starts a run) for one feature of
    assisted generation that rlpost does not use. While a `None` stands in `sys.modules`, transformers finds
    scikit-learn missing; the entry is removed afterwards, so `import sklearn` works as before (transformers
    itself keeps taking it as missing: only assisted generation's confidence-threshold tuning needs it).
    """
    if "sklearn" in sys.modules:
        from transformers import AutoTokenizer

        return AutoTokenizer
    sys.modules["sklearn"] = None  # type: ignore[assignment]
    try:
        from transformers import AutoTokenizer
    finally:
        if sys.modules.get("sklearn", 0) is None:
            del sys.modules["sklearn"]
    return AutoTokenizer


def hf_tokenizer(name_or_path: str, correct_pad_token: bool = True, correct_gemma2: bool = True,
                 **kwargs: Any) -> Any:
    """`AutoTokenizer.from_pretrained(name_or_path, **kwargs)` with a pad token (the EOS token when missing).

    Args:
        name_or_path: a local HF folder (no hub at run time).
        correct_pad_token: set `pad_token = eos_token` when the tokenizer has none.
        correct_gemma2: Gemma-2 tokenizers end turns with `<end_of_turn>`; use it as EOS, as verl does.
    """
    path = os.path.expanduser(name_or_path)
    if correct_gemma2 and "gemma-2" in path.lower():
        warnings.warn("Gemma-2 tokenizer: using <end_of_turn> (id 107) as the EOS token", stacklevel=2)
        kwargs.setdefault("eos_token", "<end_of_turn>")
    tokenizer = auto_tokenizer().from_pretrained(path, **kwargs)
    if correct_pad_token and tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def hf_processor(name_or_path: str, **kwargs: Any) -> Any:
    """The model's multimodal processor, or None for a text-only model (as verl returns)."""
    from transformers import AutoProcessor

    from rlpost.utils.vl_processor import allow_missing_video_processor

    allow_missing_video_processor()
    try:
        processor = AutoProcessor.from_pretrained(os.path.expanduser(name_or_path), **kwargs)
    except (OSError, ValueError, TypeError):
        return None
    # A text model's AutoProcessor is its tokenizer: verl treats that as "no processor".
    return None if "Processor" not in type(processor).__name__ else processor


def normalize_token_ids(tokenized_output: Any) -> list[int]:
    """One flat list[int] from what `apply_chat_template(tokenize=True)` / a tokenizer call returns: a list, a
    (1, L) batch of one, a tensor or array, or a mapping / BatchEncoding with `input_ids` (transformers 5).

    Raises:
        ValueError: a batch of more than one sequence, or entries that are not integers.
    """
    ids = tokenized_output
    if isinstance(ids, dict) or (hasattr(ids, "keys") and hasattr(ids, "__getitem__") and not hasattr(ids, "tolist")):
        if "input_ids" not in ids:
            raise ValueError(f"normalize_token_ids: a mapping without input_ids (keys {sorted(ids.keys())})")
        ids = ids["input_ids"]
    elif hasattr(ids, "input_ids"):
        ids = ids.input_ids
    if hasattr(ids, "tolist"):
        ids = ids.tolist()
    ids = list(ids) if isinstance(ids, tuple) else ids
    if isinstance(ids, list) and ids and isinstance(ids[0], (list, tuple)):
        if len(ids) != 1:
            raise ValueError(f"normalize_token_ids: a batch of {len(ids)} sequences; pass one sequence")
        ids = list(ids[0])
    if not isinstance(ids, list) or any(isinstance(t, bool) or not isinstance(t, int) for t in ids):
        raise ValueError(f"normalize_token_ids: {type(tokenized_output).__name__} does not hold one list of int ids")
    return ids
