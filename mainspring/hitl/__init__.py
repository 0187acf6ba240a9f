"""Humans in the loop: approvals, stage gates and questions as durable waits.

``ctx.approval``, ``ctx.gate`` and ``ctx.ask`` (on :class:`~mainspring.RunContext`),
short forms of the one primitive ``ctx.request``, park the run with a request that
lists what is asked; the answer arrives through the HTTP API, ``mainspring
approve``/``answer`` or :meth:`App.answer`, on any worker, after any restart.
"""

from .._requests import Approval, Request, RequestKind
from .._requests import Decision as Decision
from .._requests import answer_payload as answer_payload
from ._wait import approval as approval
from ._wait import ask as ask

__all__ = [
    "Approval",
    "Request",
    "RequestKind",
]

# For the floors above (see docs/architecture.md, "Layers"), never for users:
__internal__ = (
    "Decision",
    "answer_payload",
    "approval",
    "ask",
)
