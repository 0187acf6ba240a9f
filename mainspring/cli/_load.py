"""Finding the user's App from a ``MODULE:ATTRIBUTE`` string."""

from __future__ import annotations

from .. import App, ConfigError
from ..lab import import_object

__all__ = ["load_app"]


def load_app(spec: str) -> App:
    """Import ``package.module:attribute`` (the current directory is importable).

    Raises:
        ConfigError: the spec is malformed, the module cannot be imported, or the
            attribute is missing or not an App.
    """
    obj, _ = import_object(spec, expected="MODULE:APP (like myproject.app:app)")
    if not isinstance(obj, App):
        raise ConfigError(f"{spec!r} is a {type(obj).__name__}, not a mainspring.App")
    return obj
