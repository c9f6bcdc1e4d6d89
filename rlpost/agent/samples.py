"""Reading a dataset row's fields as the agent loops need them (verl's column conventions)."""

from __future__ import annotations

from typing import Any

from rlpost import keys


def _plain(value: Any) -> Any:
    """numpy object arrays and tuples of the batch as lists."""
    return list(value) if hasattr(value, "tolist") or isinstance(value, tuple) else value


def prompt_messages(sample: dict[str, Any], loop_name: str) -> list[dict[str, Any]]:
    """The row's chat messages (`raw_prompt`).

    Raises:
        ValueError: the row has none; the message says how to get them.
    """
    messages = sample.get(keys.RAW_PROMPT)
    if messages is None:
        raise ValueError(f"{loop_name} needs the chat messages of each row (column {keys.RAW_PROMPT!r}); "
                         "set data.return_raw_chat=True")
    return [dict(m) for m in _plain(messages)]


def _from_row_or_extra_info(sample: dict[str, Any], key: str) -> dict[str, Any]:
    value = sample.get(key)
    if value is None:
        value = (sample.get(keys.EXTRA_INFO) or {}).get(key)
    return dict(value or {})


def tools_kwargs(sample: dict[str, Any]) -> dict[str, Any]:
    """`tools_kwargs` of the row ({} when absent)."""
    return _from_row_or_extra_info(sample, keys.TOOLS_KWARGS)


def interaction_kwargs(sample: dict[str, Any]) -> dict[str, Any]:
    """`interaction_kwargs` of the row ({} when absent: no interaction)."""
    value = (sample.get(keys.EXTRA_INFO) or {}).get(keys.INTERACTION_KWARGS)
    return dict(value if value is not None else sample.get(keys.INTERACTION_KWARGS) or {})


def agent_name(sample: dict[str, Any], default: str) -> str:
    """The row's `agent_name`, else `default`."""
    name = sample.get(keys.AGENT_NAME)
    return str(name) if name else default
