"""verl's small Python helpers used by recipes."""

from __future__ import annotations

from typing import Any

__all__ = ["append_to_dict"]


def append_to_dict(data: dict[str, list], new_data: dict[str, Any]) -> None:
    """Append each value of `new_data` to the list under its key in `data` (a new key starts a list)."""
    for key, value in new_data.items():
        data.setdefault(key, []).append(value)
