"""Signal names reserved for the answers to requests to humans.

A request (an approval, a question, a budget pause, a cost checkpoint, a ``resume``
after the provider refused) waits on a signal named after it. Only the answer path
(:meth:`App.answer`, ``POST /runs/{id}/requests/{request}`` with the ``approve``
scope, ``mainspring approve``/``answer``) may store such a signal: it checks that the
request exists and records who decided. A raw signal of one of these names is refused.
"""

from __future__ import annotations

__all__ = ["REQUEST_SIGNAL_NAMES", "REQUEST_SIGNAL_PREFIXES", "is_request_signal"]

# ``child:<id>`` is the end of a child run, stored for its parent by the store alone,
# in the transaction that ends the child: no raw signal may forge it either.
REQUEST_SIGNAL_PREFIXES: tuple[str, ...] = (
    "approval:",
    "question:",
    "budget:",
    "checkpoint:",
    "child:",
)
REQUEST_SIGNAL_NAMES: tuple[str, ...] = ("resume",)


def is_request_signal(name: str) -> bool:
    """Is ``name`` reserved for the answer to a request (never a raw signal)?"""
    return name in REQUEST_SIGNAL_NAMES or name.startswith(REQUEST_SIGNAL_PREFIXES)
