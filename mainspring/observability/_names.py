"""What a journal step is, for traces, metrics and the dashboard, and the data a
step's name carries beyond its role.

:func:`step_role` is the one place that tells a step's role from its journal row: its
``kind`` and, for a ``ctx.step``, the ``role`` its writer declared
(``ctx.step(..., role=...)``, the ``role`` column of ``ms_steps``; migration 9 filled
it for journals written before, from their names). Everything else (trace kinds,
metric labels, the dashboard's grouping and filters) asks it, never a name's prefix.

A name still carries data the role does not: the model of ``model:<provider>:<id>``,
the tool of ``tool:<name>``, the model a ``rate:`` step was for. :func:`model_of`,
:func:`tool_of_name` and :func:`rate_model` read them, here and nowhere else.
"""

from __future__ import annotations

import json
from typing import Literal, get_args

from ..storage import JournalRole

__all__ = [
    "BackPressure",
    "StepRole",
    "back_pressure",
    "journaled_error_type",
    "model_of",
    "price_key",
    "public_error_type",
    "rate_model",
    "step_kind",
    "step_role",
    "tool_of_name",
]

StepRole = Literal[JournalRole, "internal"]
"""What a step is to a person reading a run:

- ``model``: a model call; ``tool``: a tool call; ``step``: any other ``ctx.step``.
- ``wait``: time the run spent waiting, not working: a sleep, a signal (an approval,
  a question, ``ctx.wait_for``) or a rate-limit wait (a ``ctx.step`` of role
  ``wait``: the wait a provider's refusal asked for, ``rate:wait:NAME``).
- ``rate``: rate-limit bookkeeping: a slot booked before a model call (``rate:KEY``)
  or given back (``rate-refund:KEY``). A booking may still make the run wait (its
  trace entry's ``rate_wait_s``).
- ``internal``: a recorded value (``ctx.now()``, ``ctx.uuid()``, ``ctx.random()``, a
  patch marker of ``ctx.patched``): journaled so that a replay sees the same value, no
  work of its own.

The roles of a ``ctx.step`` are :data:`mainspring.storage.JournalRole`, this less
``internal``.
"""

_WAITS = frozenset({"sleep", "signal"})
_RECORDED = frozenset({"now", "uuid", "random", "patch"})
_DECLARED: dict[str, StepRole] = {r: r for r in get_args(JournalRole)}


def step_role(kind: str, role: str = "step") -> StepRole:
    """The role of a journal row from its ``kind`` (a journal kind, or a trace kind:
    ``model``/``tool``) and, for a ``ctx.step``, its declared ``role``
    (:attr:`StepRecord.role <mainspring.storage.StepRecord>`). A role this version does
    not know (a newer writer's) reads as ``step``."""
    if kind in ("model", "tool"):
        return "model" if kind == "model" else "tool"
    if kind in _WAITS:
        return "wait"
    if kind in _RECORDED:
        return "internal"
    return _DECLARED.get(role, "step")


def step_kind(role: str) -> str:
    """The ``kind`` label of a ``ctx.step`` of this role in metrics and spans:
    ``model``, ``tool``, ``rate`` (rate-limit bookkeeping and waits) or ``step``."""
    found = step_role("step", role)
    if found in ("model", "tool"):
        return found
    return "rate" if found in ("rate", "wait") else "step"


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


def price_key(name: str) -> str:
    """The id a price table knows a ``model:...`` step's model by: ``gpt-4.1`` for
    ``model:openai:gpt-4.1`` (an older journal's ``@http://user:pass@proxy`` suffix
    is not part of it, see :func:`model_of`)."""
    return model_of(name).split(":", 1)[-1]


def tool_of_name(name: str) -> str:
    """The tool of a tool step's name: ``tool:send_email`` -> ``send_email``."""
    return name.removeprefix("tool:")


def rate_model(role: str, name: str) -> str:
    """The logical model a rate step was for: a wait's ``rate:wait:openai:gpt-4.1``
    and a booking's ``rate:openai:gpt-4.1:ACCOUNT`` (or ``rate-refund:...``) ->
    ``openai:gpt-4.1``."""
    if role == "wait":
        return name.removeprefix("rate:wait:")
    return name.partition(":")[2].rsplit(":", 1)[0]


BackPressure = Literal["rate_limited", "overloaded", "lapsed"]
"""How a model call was held back rather than failed: a 429 (``rate_limited``), an
overload answer such as Anthropic's 529 (``overloaded``), or a booked rate-limit slot
that passed before the request could go (``lapsed``). None of them spends an attempt
of the step, fails the run or is an error: the run waits and calls again."""

_BACK_PRESSURE: dict[str, BackPressure] = {
    "RateLimited": "rate_limited",
    "Overloaded": "overloaded",
    "SlotLapsed": "lapsed",
}


def back_pressure(error_type: str | None) -> BackPressure | None:
    """The back-pressure a model call's error type (its class name, qualified or
    not) stands for, or ``None`` for a real failure."""
    if not error_type:
        return None
    return _BACK_PRESSURE.get(error_type.rsplit(".", 1)[-1])


def public_error_type(qualified: str | None) -> str:
    """The name an operator reads for an error class: ``mainspring.StepFailed`` for
    ``mainspring._errors.StepFailed`` (the private module a class lives in is not
    where users import it from), ``ValueError`` for a built-in, a user's own class
    as qualified (``billing.CardDeclined``)."""
    if not qualified:
        return "Error"
    module, _, name = qualified.rpartition(".")
    if not module or module == "builtins":
        return name
    parts = module.split(".")
    if parts[0] != "mainspring":
        return qualified
    public = [p for p in parts if not p.startswith("_")]  # mainspring.agent._call -> agent
    return ".".join([*public, name])


def journaled_error_type(error: str | None) -> str | None:
    """The ``type`` of a journaled error (JSON), without parsing any other."""
    if not error or '"type"' not in error:
        return None
    try:
        value = json.loads(error)
    except ValueError:
        return None
    return str(value.get("type")) if isinstance(value, dict) else None
