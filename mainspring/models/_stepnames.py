"""How model steps are named in the journal, and the older spelling replay still accepts.

A step's identity is what the workflow decided, never deployment configuration: a model
step is ``model:<provider>:<model_id>``, whatever URL, key or settings reach that model.
Before this rule, the OpenAI and Anthropic adapters put their endpoint in the name
(``model:openai:gpt-4.1-mini@http://127.0.0.1:8080/v1``), so moving the endpoint broke
every run in flight. Journals written then still replay: a journaled model step whose
name is the current one plus ``@<scheme>://...`` is the same step.

This is the models floor's knowledge: the journal knows nothing of models. The App hands
:func:`without_endpoint` to its engine (``Engine.canonical_step_name``), through which
replay compares a journaled name with the one the workflow asks for.
"""

from __future__ import annotations

import re

__all__ = ["model_step_name", "without_endpoint"]

# "@" then a URL scheme: a model id may hold an "@" (Vertex's "claude-3-5@20240620"),
# never "@scheme://".
_ENDPOINT = re.compile(r"@[A-Za-z][A-Za-z0-9+.-]*://")


def model_step_name(provider: str, model_id: str) -> str:
    """The journal name of a call to this logical model."""
    return f"model:{provider}:{model_id}"


def without_endpoint(name: str) -> str:
    """A model step name without the endpoint URL an older journal may carry."""
    if not name.startswith("model:"):
        return name
    found = _ENDPOINT.search(name)
    return name[: found.start()] if found else name
