"""The OpenAI Agents SDK (``openai-agents``) on mainspring: an existing
``agents.Agent`` as a durable, journaled mainspring workflow.

::

    from mainspring.integrations.openai_agents import durable

    support = durable(app, agent, name="support")
    run = app.submit(support, "Refund order 7", key="t-7")

See docs/bring-your-agent.md. Needs ``pip install 'mainspring[openai-agents]'``.
"""

from __future__ import annotations

try:
    import agents as _agents  # noqa: F401
except ImportError as exc:  # pragma: no cover - the extra is installed in the tests
    from mainspring import MissingExtra

    raise MissingExtra(
        "mainspring.integrations.openai_agents", "openai-agents", getattr(exc, "name", None)
    ) from exc

from ._model import JournaledModel, JournaledProvider
from ._run import durable
from ._tools import DEFAULT_EFFECT, JournaledMCPServer, effect

__all__ = [
    "DEFAULT_EFFECT",
    "JournaledMCPServer",
    "JournaledModel",
    "JournaledProvider",
    "durable",
    "effect",
]
