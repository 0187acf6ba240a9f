"""LangGraph graphs, durable on mainspring without a rewrite.

    from mainspring.integrations.langgraph import durable

    flow = durable(app, graph, name="support")  # a compiled graph, or its builder
    run = app.submit(flow, {"messages": [("user", "refund order 7")]}, key="t-7")

Each node execution is a journaled step, ``interrupt()`` a request to a human (a
durable wait), and a run resumes at the exact node after a crash; LangGraph's state
APIs read a run's checkpoints from mainspring's database (:class:`MainspringSaver`).
See docs/bring-your-agent.md. Needs the ``langgraph`` extra.
"""

from __future__ import annotations

try:
    import langgraph.pregel  # noqa: F401
    from langgraph.checkpoint.base import BaseCheckpointSaver  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised in a venv without the extra
    from ... import MissingExtra

    raise MissingExtra("mainspring.integrations.langgraph", "langgraph", exc.name) from exc

from ._flow import DurableGraph, InterruptKind, durable
from ._models import MalformedToolCalls
from ._saver import MainspringSaver

__all__ = ["DurableGraph", "InterruptKind", "MainspringSaver", "MalformedToolCalls", "durable"]
