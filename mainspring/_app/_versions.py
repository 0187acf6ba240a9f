"""An App's code version: what it stamps on the runs it submits."""

from __future__ import annotations

from .._errors import ConfigError

__all__ = ["check_version"]

# Words the CLI reads as "runs with no version" and "runs of every version".
_RESERVED = frozenset({"none", "any"})


def check_version(version: object) -> str | None:
    """``version`` if it can name a code version (``None``: no version)."""
    if version is None:
        return None
    if (
        not isinstance(version, str)
        or not version
        or version != version.strip()
        or len(version) > 200
        or version.lower() in _RESERVED
    ):
        raise ConfigError(
            f"App(version={version!r}): a version is a non-empty string of at most 200 "
            "characters with no leading or trailing space, and not 'none' or 'any' "
            "(the CLI's words for runs with no version and runs of every version)"
        )
    return version
