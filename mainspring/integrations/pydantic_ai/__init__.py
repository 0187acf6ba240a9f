"""Pydantic AI agents, durable on mainspring without a rewrite.

::

    from mainspring.integrations.pydantic_ai import durable

    support = durable(app, agent, name="support")   # a registered mainspring Workflow
    run = app.submit(support, "Refund order 7", key="t-7")

Each model request and tool call of ``agent.run(...)`` is a journaled step; approvals
and deferred tools are durable waits for a human; see docs/bring-your-agent.md.
Needs the extra: ``pip install 'mainspring[pydantic-ai]'``.
"""

try:
    import pydantic_ai as _pydantic_ai  # noqa: F401
    from pydantic_ai.models.wrapper import WrapperModel as _WrapperModel  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised by tests/test_integration_pydantic_ai.py
    from mainspring import MissingExtra

    raise MissingExtra(
        "mainspring.integrations.pydantic_ai", "pydantic-ai", getattr(exc, "name", None)
    ) from exc

from ._durable import durable
from ._mcp import forward_idempotency_key
from ._model import PydanticAIReply

__all__ = ["PydanticAIReply", "durable", "forward_idempotency_key"]
