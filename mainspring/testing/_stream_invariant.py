"""The invariant of live token streams: the output a reader assembles, following
docs/streaming.md, is the reply the journal keeps.

A reader keeps, for each model step, the output of the attempt it is shown and drops
an attempt's output when its stream ends ``interrupted``. For every model step the
journal completed, the attempt whose stream ended ``done`` and was never voided must
carry exactly the journaled reply's text and tool calls' arguments (compared as JSON
values where both parse, as providers may space them differently). A step whose
stream never ended ``done`` (it broke off, or its rows were pruned) has nothing to
compare.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .. import TokenFollower
from ..storage import Store

__all__ = ["assembled", "stream_mismatches"]


@dataclass(slots=True)
class _Output:
    text: list[str] = field(default_factory=list)
    calls: dict[int, list[str]] = field(default_factory=dict)
    done: bool = False


def assembled(store: Store, run_id: str, *, finished: bool) -> dict[tuple[int, int], _Output]:
    """What a reader of ``run_id``'s streams holds per ``(session, seq)`` once it has
    read everything: the output of the attempt it was shown last, unless voided."""
    follower = TokenFollower(store, run_id)
    events = follower.poll() + (follower.close_open() if finished else [])
    shown: dict[tuple[int, int], tuple[tuple[int, int], _Output]] = {}
    for e in events:
        key, version = (e.session, e.seq), (e.epoch, e.attempt)
        held = shown.get(key)
        if held is None or held[0] != version:
            held = shown[key] = (version, _Output())
        out = held[1]
        if e.kind == "tool_call":
            out.calls.setdefault(e.call_index or 0, []).append(e.arguments)
        elif e.end is None:
            out.text.append(e.text)
        elif e.end == "done":
            out.done = True
        else:  # interrupted: this attempt's output is void
            shown[key] = (version, _Output())
    return {key: out for key, (_, out) in shown.items()}


def stream_mismatches(
    store: Store, run_id: str, model_rows: Iterable[tuple[int, int, str | None]], *, finished: bool
) -> list[str]:
    """What differs between the streams a reader assembles and the journaled replies
    of the completed model steps ``(session, seq, output)`` of ``run_id``."""
    rows = list(model_rows)
    if not rows:
        return []
    held = assembled(store, run_id, finished=finished)
    found = []
    for session, seq, output in rows:
        out = held.get((session, seq))
        if out is None or not out.done:
            continue
        reply = _json(output)
        text = "".join(out.text)
        if text != (reply.get("text") or ""):
            found.append(f"step {session}:{seq}: a reader assembled {text!r}, the journal "
                         f"holds {reply.get('text')!r}")  # fmt: skip
        journaled = [c.get("arguments", "") for c in reply.get("tool_calls") or []]
        streamed = ["".join(out.calls[i]) for i in sorted(out.calls)]
        if out.calls and [_value(a) for a in streamed] != [_value(a) for a in journaled]:
            found.append(f"step {session}:{seq}: a reader assembled the tool calls' "
                         f"arguments {streamed!r}, the journal holds {journaled!r}")  # fmt: skip
    return found


def _json(text: str | None) -> dict[str, Any]:
    try:
        value = json.loads(text or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _value(arguments: str) -> Any:
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments
