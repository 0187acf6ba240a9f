"""Finding the user's App from a ``MODULE:ATTRIBUTE`` string."""

from __future__ import annotations

import importlib
import os
import sys

from .._app import App
from .._errors import ConfigError

__all__ = ["load_app"]


def load_app(spec: str) -> App:
    """Import ``package.module:attribute`` (the current directory is importable).

    Raises:
        ConfigError: the spec is malformed, the module cannot be imported, or the
            attribute is missing or not an App.
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"expected MODULE:APP (like myproject.app:app), got {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"cannot import module {module_name!r} from {spec!r}: {exc}") from exc
    except Exception as exc:  # the module itself failed: say so in one line
        raise ConfigError(
            f"importing {module_name!r} (from {spec!r}) raised {type(exc).__name__}: {exc}"
        ) from exc
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"module {module_name!r} has no attribute {attr!r} (from {spec!r})")
        obj = getattr(obj, part)
    if not isinstance(obj, App):
        raise ConfigError(f"{spec!r} is a {type(obj).__name__}, not a mainspring.App")
    return obj
