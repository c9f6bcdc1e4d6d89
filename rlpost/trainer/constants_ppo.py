"""verl's `get_ppo_ray_runtime_env()`: the runtime_env a custom driver passes to `ray.init`."""

from __future__ import annotations

from typing import Any

from rlpost.single_controller.ray.init import build_runtime_env

__all__ = ["get_ppo_ray_runtime_env"]


def get_ppo_ray_runtime_env() -> dict[str, Any]:
    """rlpost's worker environment (`env_vars`: its defaults, overridden by the driver's own values), as
    `main_ppo` gives Ray: `ray.init(runtime_env=get_ppo_ray_runtime_env())`."""
    return build_runtime_env()
