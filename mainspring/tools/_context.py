"""Effect classes and the context a tool sees when it runs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

__all__ = ["DEFAULT_TIMEOUT_S", "EFFECTS", "Effect", "ToolContext"]

Effect = Literal["read", "write", "irreversible"]
"""What a tool does to the world, which decides how it may be repeated.

* ``"read"``: no side effect; safe to run again at any time.
* ``"write"``: a side effect that is safe to repeat *with the idempotency key*: the tool
  passes ``ctx.idempotency_key`` to the outside world, which recognises a repeat.
* ``"irreversible"``: a side effect that cannot be repeated or undone (a payment without
  idempotency, a deletion). Needs approval by default and is never re-run blindly.
"""

EFFECTS: Final[tuple[Effect, ...]] = ("read", "write", "irreversible")

# Per-attempt timeouts: reads should be quick; slower effects get more room, because
# abandoning a half-done write costs more than waiting a little longer for it.
DEFAULT_TIMEOUT_S: Final[dict[Effect, float]] = {
    "read": 30.0,
    "write": 60.0,
    "irreversible": 120.0,
}


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolContext:
    """What a tool knows about the call it is serving.

    A tool receives it through a keyword-only parameter annotated ``ToolContext``
    (conventionally ``*, ctx: ToolContext``); that parameter is not part of the tool's
    schema and the model never sees it.

    Attributes:
        run_id: the run the call belongs to.
        session: the run's session number.
        seq: the step's position in the session.
        attempt: 1 on the first attempt, then 2, 3, ... on retries and after crashes.
        idempotency_key: ``"{run_id}:{session}:{seq}"``, the same on every attempt and
            after every crash: pass it to the outside world so a repeated call is
            recognised as the same call.
        tool: the tool's name.
        effect: the tool's effect class.
    """

    run_id: str
    session: int
    seq: int
    attempt: int
    idempotency_key: str
    tool: str
    effect: Effect
