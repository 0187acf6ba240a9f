"""Patches: code that changes under running runs (``ctx.patched``, ``ctx.version``).

A run replays its journal with whatever code the worker has now, so a change to a
workflow's steps would meet runs started under the old code with
:class:`NondeterminismError`. A patch records which side of a change a run is on: the
first execution past the change journals a marker row (kind ``patch``, named by the
change id, its version as output); a replay of that run finds the marker and takes the
new code again; a replay of a journal written before the change finds some other row
there, consumes nothing, and takes the old code, whose steps line up with the old
journal. Once no run from before a change is left, ``deprecate_patch`` keeps the marker
(for workers still running the patched code) and refuses the old branch; once no
worker runs that code, the call is removed and the cursor passes over its markers.
"""

from __future__ import annotations

from .._errors import ConfigError, NondeterminismError
from ._cursor import Cursor

__all__ = ["deprecate_patch", "patched", "version"]

# The version of a run that predates a change (no marker where the code asks).
BEFORE = 0


def _check_id(change_id: object, what: str) -> str:
    if not isinstance(change_id, str) or not change_id.strip():
        raise ConfigError(f"ctx.{what}(change_id): a non-empty string is needed, got {change_id!r}")
    return change_id


def patched(cur: Cursor, change_id: str) -> bool:
    """Whether this run takes the code after the change ``change_id``."""
    _check_id(change_id, "patched")
    return cur.patch(change_id, 1) is not None


def deprecate_patch(cur: Cursor, change_id: str) -> None:
    """The change is the only code now: keep its marker, refuse runs from before it."""
    _check_id(change_id, "deprecate_patch")
    if cur.patch(change_id, 1) is None:
        raise cur.life.fail(
            NondeterminismError(
                f"this run started before the change {change_id!r}, whose old code was "
                f"removed (ctx.deprecate_patch({change_id!r})): finish such runs under "
                f"code that still checks ctx.patched({change_id!r}) first",
                run_id=cur.run_id,
                step=cur.where(cur.seq + 1, change_id),
                position=cur.seq + 1,
                got=("patch", change_id),
            )
        )


def version(cur: Cursor, change_id: str, min_supported: int, max_supported: int) -> int:
    """The version of the change ``change_id`` this run is on (see RunContext.version)."""
    _check_id(change_id, "version")
    for value in (min_supported, max_supported):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ConfigError(
                f"ctx.version({change_id!r}, {min_supported!r}, {max_supported!r}): "
                "versions are integers >= 0"
            )
    if max_supported < 1 or min_supported > max_supported:
        raise ConfigError(
            f"ctx.version({change_id!r}, {min_supported!r}, {max_supported!r}): need "
            "0 <= min_supported <= max_supported and max_supported >= 1 (0 is the code "
            "before the first change)"
        )
    found = cur.patch(change_id, max_supported)
    taken = BEFORE if found is None else found
    if not min_supported <= taken <= max_supported:
        raise cur.life.fail(
            NondeterminismError(
                f"this run is on version {taken} of the change {change_id!r}, but the code "
                f"supports versions {min_supported} to {max_supported} only: finish such "
                "runs under code that still supports their version first",
                run_id=cur.run_id,
                step=cur.where(cur.seq + 1 if found is None else cur.seq, change_id),
                position=cur.seq + 1 if found is None else cur.seq,
                got=("patch", change_id),
            )
        )
    return taken
