"""Importing the user's objects from a ``MODULE:OBJECT`` string (the lab, preflight and the CLI)."""

from __future__ import annotations

import importlib
import os
import sys
from types import ModuleType
from typing import Any

from .. import ConfigError

__all__ = ["import_object"]


def import_object(
    spec: str, *, expected: str = "MODULE:OBJECT (like myproject.agents:triage)"
) -> tuple[Any, ModuleType]:
    """Import ``MODULE:OBJECT`` (``OBJECT`` may be dotted; the current directory is
    importable): the object and its module.

    Raises:
        ConfigError: a malformed spec, a module that does not import, a missing attribute.
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"expected {expected}, got {spec!r}")
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
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"module {module_name!r} has no attribute {attr!r} (from {spec!r})")
        obj = getattr(obj, part)
    return obj, module
