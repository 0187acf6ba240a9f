"""Configuration files that hold one list of tables (``[[rate_limit]]``,
``[[schedule]]``), in TOML or JSON: read, parsed and checked alike."""

from __future__ import annotations

import json
import tomllib
from os import PathLike
from pathlib import Path
from typing import Any

from ._errors import ConfigError

__all__ = ["config_entries"]


def config_entries(path: str | PathLike[str], *, what: str, key: str) -> list[Any]:
    """The entries of the list named ``key`` in the TOML (``[[key]]`` tables) or JSON
    (``{"key": [...]}``, for a ``.json`` file) file at ``path``; ``what`` names the
    file in errors ("rate limits"). The entries themselves are the caller's to check.

    Raises:
        ConfigError: the file is missing, unreadable, not TOML/JSON, or holds anything
            but that one list.
    """
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{what} file {str(file)!r}: cannot read it: {exc}") from None
    try:
        data: Any = json.loads(text) if file.suffix == ".json" else tomllib.loads(text)
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        kind = "JSON" if file.suffix == ".json" else "TOML"
        raise ConfigError(f"{what} file {str(file)!r} is not valid {kind}: {exc}") from None
    if not isinstance(data, dict) or set(data) - {key}:
        found = sorted(data) if isinstance(data, dict) else data
        raise ConfigError(
            f"{what} file {str(file)!r}: expected only a list named {key!r} "
            f"([[{key}]] tables in TOML), found {found!r:.200}"
        )
    entries = data.get(key, [])
    if not isinstance(entries, list):
        raise ConfigError(f"{what} file {str(file)!r}: {key!r} must be a list")
    return entries
