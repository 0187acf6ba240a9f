"""The agent, its tools, and the script its model plays."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import mainspring as ms
from mainspring.models import Message, ScriptedModel, ToolSpec

__all__ = ["CORPUS", "build", "script"]

CORPUS = {
    "doc-1": "Durable execution journals each step; a crashed run replays the journal.",
    "doc-2": "Idempotency keys let an outside API recognise a repeated call.",
    "doc-3": "Stage gates put a human decision before irreversible writes.",
}


def search(query: str) -> list[str]:
    """Find the documents whose text mentions any word of ``query``."""
    words = {w.lower() for w in re.findall(r"\w+", query) if len(w) > 3}
    return [d for d, text in CORPUS.items() if words & set(re.findall(r"\w+", text.lower()))]


def read(doc: str) -> str:
    """Read one document."""
    if doc not in CORPUS:
        raise ms.ToolInputError(f"no document {doc!r}; known: {', '.join(CORPUS)}")
    return CORPUS[doc]


def _answer_from_handoff(messages: Sequence[Message], tools: Sequence[ToolSpec]) -> object:
    """The last turn: answer from the facts the hand-off carried into this session."""
    text = "\n".join(getattr(m, "content", None) or "" for m in messages)
    facts = re.findall(r"^\s+- (finding: .+)$", text, flags=re.MULTILINE)
    return ScriptedModel.call("finish", {"answer": "; ".join(facts) or "no findings carried"})


def script() -> list[Any]:
    """Seven turns: three sessions of at most three turns each."""
    call = ScriptedModel.call
    return [
        # session 1: plan, search, record what was learned
        call(
            "update_state",
            {"plan": [{"text": "find sources"}, {"text": "read them"}, {"text": "summarise"}]},
        ),
        call("search", {"query": "journal replay idempotency"}),
        call(
            "update_state",
            {
                "facts": ["finding: sources are doc-1 and doc-2"],
                "note": "session 1: searched; read doc-1 and doc-2 next",
            },
        ),
        # session 2: read, record
        call("read", {"doc": "doc-1"}),
        call("read", {"doc": "doc-2"}),
        call(
            "update_state",
            {
                "facts": ["finding: crashes replay the journal; keys stop repeated effects"],
                "plan": [
                    {"text": "find sources", "status": "done"},
                    {"text": "read them", "status": "done"},
                    {"text": "summarise", "status": "doing"},
                ],
            },
        ),
        # session 3: the answer, written from the hand-off alone
        _answer_from_handoff,
    ]


def build(app: ms.App, model: ScriptedModel | None = None) -> ms.Workflow[[str], ms.AgentResult]:
    """Register the ``researcher`` agent on ``app``."""
    return app.agent(
        "researcher",
        model=model or ScriptedModel(script(), model_id="researcher"),
        instructions="Research the question with search and read; keep findings as facts.",
        tools=[app.tool(search), app.tool(read)],
        session_turns=3,
        limits=ms.Limits(max_steps=40),
    )
