"""What a journal step is, for traces, metrics and the dashboard.

:func:`step_role` is the one place that reads a step's role out of its journal kind and
name; everything else (trace kinds, metric labels, the dashboard's grouping and filters)
asks it. Today the role of a ``ctx.step`` is spelled in its name's prefix
(``model:``, ``tool:``, ``rate:``); when the journal stores the role itself, this
function reads that instead and nothing else changes.
"""

from __future__ import annotations

from typing import Literal

__all__ = ["StepRole", "model_of", "step_kind", "step_role"]

StepRole = Literal["model", "tool", "step", "wait", "rate", "internal"]
"""What a step is to a person reading a run:

- ``model``: a model call; ``tool``: a tool call; ``step``: any other ``ctx.step``.
- ``wait``: time the run spent waiting, not working: a sleep, a signal (an approval,
  a question, ``ctx.wait_for``) or a rate-limit wait (``rate:wait:NAME``, the wait a
  provider's refusal asked for).
- ``rate``: rate-limit bookkeeping: a slot booked before a model call (``rate:KEY``)
  or given back (``rate-refund:KEY``). A booking may still make the run wait (its
  trace entry's ``rate_wait_s``).
- ``internal``: a recorded value (``ctx.now()``, ``ctx.uuid()``, ``ctx.random()``):
  journaled so that a replay sees the same value, no work of its own.
"""

_WAITS = frozenset({"sleep", "signal"})
_RECORDED = frozenset({"now", "uuid", "random"})


def step_role(kind: str, name: str) -> StepRole:
    """The role of a journal row from its ``kind`` (a journal kind, or a trace
    kind: ``model``/``tool``) and its ``name``."""
    if kind in ("model", "tool"):
        return "model" if kind == "model" else "tool"
    if kind in _WAITS:
        return "wait"
    if kind in _RECORDED:
        return "internal"
    head, colon, rest = name.partition(":")
    if not colon:
        return "step"
    if head == "model":
        return "model"
    if head == "tool":
        return "tool"
    if head == "rate":
        return "wait" if rest.startswith("wait:") else "rate"
    if head == "rate-refund":
        return "rate"
    return "step"


def step_kind(name: str) -> str:
    """The ``kind`` label of a ``ctx.step`` in metrics and spans: ``model``, ``tool``,
    ``rate`` (rate-limit bookkeeping and waits) or ``step``."""
    role = step_role("step", name)
    if role in ("model", "tool"):
        return role
    return "rate" if role in ("rate", "wait") else "step"


def model_of(name: str) -> str:
    """The logical model (``provider:model``) of a ``model:...`` step name, without
    the endpoint URL (and its credentials) that older journals append after ``@``:
    ``model:openai:gpt-4.1@http://user:pass@proxy/v1`` -> ``openai:gpt-4.1``."""
    logical = name[len("model:") :] if name.startswith("model:") else name
    scheme = logical.find("://")
    if scheme != -1:
        at = logical.rfind("@", 0, scheme)
        logical = logical[:at] if at != -1 else logical[:scheme]
    return logical
