"""Loading users' Python code named by config keys, and verl's import helpers.

`load_function_from_file` imports a user's file (a reward function, a reward manager, a dataset class, ...)
once per path under a path-derived module name; `load_extern_type` and `import_external_libs` are verl's names.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any, Callable

__all__ = ["UserCodeError", "import_external_libs", "load_extern_type", "load_function_from_file"]


class UserCodeError(ValueError):
    """A user's Python file named by a config key cannot be used: it does not import, or lacks the name."""


@functools.lru_cache(maxsize=32)
def _load_module(path: str, path_key: str):
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"{path_key}: file not found: {path}")
    # A stable, path-derived module name: two files called `reward.py` must not clash.
    mod_name = "rlpost_user_module_" + hashlib.md5(str(file.resolve()).encode()).hexdigest()[:12]
    spec = importlib.util.spec_from_file_location(mod_name, str(file))
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[mod_name]
        raise UserCodeError(f"{path_key}: error while importing {path}: {exc!r}") from exc
    return module


def load_function_from_file(path: str, name: str, config_key: str = "custom_reward_function",
                            path_field: str = "path", name_field: str = "name") -> Callable[..., Any]:
    """Import `path` as a module and return its attribute `name` (a function or a class).

    Error messages name `{config_key}.{path_field}` and `{config_key}.{name_field}`.

    Raises:
        FileNotFoundError: `path` does not exist.
        UserCodeError: the file does not import, or has no callable `name` (the message lists the callables
            it has).
    """
    module = _load_module(str(path), f"{config_key}.{path_field}")
    fn = getattr(module, name, None)
    if not callable(fn):
        available = sorted(k for k, v in vars(module).items() if callable(v) and not k.startswith("_"))
        raise UserCodeError(
            f"{config_key}.{name_field}: {name!r} not found in {path}; callables there: {available}"
        )
    return fn


def import_external_libs(names: str | list[str] | None) -> None:
    """Import the module(s) of `model.external_lib` (a name, a list, or None) so they can register custom
    models with HF's auto classes."""
    if names is None:
        return
    for name in [names] if isinstance(names, str) else list(names):
        importlib.import_module(str(name))


def load_extern_object(path: str, name: str, config_key: str = "load_extern_type", path_field: str = "file_path",
                       name_field: str = "type_name") -> Any:
    """The object `name` of a user file or module, read as verl reads such a path: `pkg://a.b.c` (or
    `pkg://a/b/c`) or a plain dotted `a.b.c` imports the module; `file:///abs/x.py` or a file path loads the file.

    Raises:
        FileNotFoundError / UserCodeError: the file is missing, the module or file does not import, or lacks
            `name`; messages name `{config_key}.{path_field}` / `{config_key}.{name_field}`.
    """
    path = str(path)
    module_name = path[len("pkg://"):].replace("/", ".") if path.startswith("pkg://") else None
    if module_name is None and not path.endswith(".py") and "/" not in path and not path.startswith("file://"):
        module_name = path
    if module_name is not None:
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise UserCodeError(f"{config_key}.{path_field}: cannot import module {module_name!r}: {exc}") from exc
        if not hasattr(module, name):
            raise UserCodeError(f"{config_key}.{name_field}: {name!r} not found in module {module_name}")
        return getattr(module, name)
    path = path[len("file://"):] if path.startswith("file://") else path
    return load_function_from_file(path, name, config_key, path_field, name_field)


def load_extern_type(file_path: str | None, type_name: str) -> Any:
    """verl's name: `load_extern_object(file_path, type_name)`, or None when `file_path` is None."""
    return None if file_path is None else load_extern_object(file_path, type_name)
