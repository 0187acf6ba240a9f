"""Humans in the loop: approvals, stage gates and questions as durable waits.

``ctx.approval``, ``ctx.gate`` and ``ctx.ask`` (on :class:`~mainspring.RunContext`),
short forms of the one primitive ``ctx.request``, park the run with a request that
lists what is asked; the answer arrives through the HTTP API, ``mainspring
approve``/``answer`` or :meth:`App.answer`, on any worker, after any restart.
"""

from .._requests import Approval, Decision, Request, RequestKind, answer_payload, approval_from
from ._wait import approval, ask

__all__ = [
    "Approval",
    "Decision",
    "Request",
    "RequestKind",
    "answer_payload",
    "approval",
    "approval_from",
    "ask",
]
