"""Requests to humans and their answers, as values.

A request is a durable wait whose journal row carries what is asked (kind, title,
preview, choices). Its id is the signal it waits on (``approval:<name>``,
``question:<name>``, ``budget:<limit>``, ``checkpoint:…``, ``resume``): names reserved
for the answer path (:meth:`App.answer`, which checks the request and records who
decided), never sent as raw signals (see ``mainspring._signals``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from ._errors import InvalidAnswer

__all__ = [
    "Approval",
    "Decision",
    "OnTimeout",
    "Request",
    "RequestKind",
    "answer_payload",
    "approval_from",
    "request_from_row",
    "request_meta",
]

RequestKind = Literal["approval", "question"]
Decision = Literal["approve", "reject", "edit"]
OnTimeout = Literal["approve", "reject", "answer", "fail"]
_ON_TIMEOUT: tuple[str, ...] = ("approve", "reject", "answer", "fail")
_DECISIONS: tuple[str, ...] = ("approve", "reject", "edit")


@dataclass(frozen=True, slots=True, kw_only=True)
class Request:
    """A pending (or answered) request to a human.

    Attributes:
        id: the request's id within its run: the signal its wait consumes.
        kind: ``"approval"`` (approve, reject or edit) or ``"question"`` (an answer).
        title: what is asked, in a line.
        preview: what the reviewer should see (the tool call, the plan, the numbers).
        choices: the allowed answers of a question, if limited.
        created_at: when the run started waiting (epoch seconds).
        deadline: when the default applies, if the wait has a timeout.
        on_timeout: what happens at the deadline, for a wait with a timeout:
            ``"approve"`` or ``"reject"`` (an approval's default), ``"answer"`` (a
            question's default answer, ``default_answer``) or ``"fail"`` (the run
            fails with :class:`~mainspring.WaitTimeout`). ``None``: no timeout, or a
            request from before this was recorded.
        default_answer: a question's default answer (with ``on_timeout="answer"``).
    """

    run_id: str
    workflow: str
    id: str
    kind: RequestKind
    title: str
    preview: Any = None
    choices: tuple[str, ...] | None = None
    created_at: float
    deadline: float | None = None
    on_timeout: OnTimeout | None = None
    default_answer: str | None = None

    def to_json(self) -> dict[str, Any]:
        extra: dict[str, Any] = {}
        if self.on_timeout is not None:  # only where the wait has a timeout
            extra["on_timeout"] = self.on_timeout
            if self.default_answer is not None:
                extra["default_answer"] = self.default_answer
        return {
            "run_id": self.run_id,
            "workflow": self.workflow,
            "id": self.id,
            "kind": self.kind,
            "title": self.title,
            "preview": self.preview,
            "choices": list(self.choices) if self.choices is not None else None,
            "created_at": self.created_at,
            "deadline": self.deadline,
            **extra,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class Approval:
    """A reviewer's decision.

    Attributes:
        approved: go ahead (``approve`` or ``edit``).
        reason: why, as the reviewer wrote it (the agent sees it on a rejection).
        arguments: the edited arguments, when the reviewer changed them.
        by: who decided (the API key's name, or the CLI user).
        timed_out: nobody answered before the wait's timeout; the default applied.
    """

    approved: bool
    reason: str | None = None
    arguments: dict[str, Any] | None = None
    by: str | None = None
    timed_out: bool = False


def request_meta(
    kind: RequestKind,
    title: str,
    preview: Any = None,
    choices: tuple[str, ...] | None = None,
    *,
    on_timeout: OnTimeout | None = None,
    default_answer: str | None = None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"kind": kind, "title": title, "preview": preview}
    if choices is not None:
        meta["choices"] = list(choices)
    if on_timeout is not None:  # a wait with a timeout: the reviewer sees what it does
        meta["on_timeout"] = on_timeout
        if default_answer is not None:
            meta["default_answer"] = default_answer
    return meta


def approval_from(payload: Any) -> Approval:
    """Read a decision from a signal payload.

    Accepts the canonical ``{"decision": "approve"|"reject"|"edit", ...}`` that the
    answer path writes, and the shorter forms raw signals carried before request names
    were reserved (journals of older runs): ``{"approve": true}``, ``{"action":
    "continue"|"stop"}``, ``true``/``false`` and the bare words.
    """
    if isinstance(payload, bool):
        return Approval(approved=payload)
    if isinstance(payload, str):
        return Approval(approved=payload not in ("stop", "reject", "cancel", "no"))
    if not isinstance(payload, dict):
        return Approval(approved=False, reason=f"unreadable decision {payload!r}")
    arguments = payload.get("arguments")
    if "limit" in payload and arguments is None:
        arguments = {"limit": payload["limit"]}
    if "decision" in payload:
        approved = payload["decision"] in ("approve", "edit")
    elif "approve" in payload:
        approved = bool(payload["approve"])
    elif "action" in payload:
        approved = payload["action"] not in ("stop", "reject", "cancel")
    else:  # no decision at all: only a raised limit means "go on"; never approve by default
        approved = "limit" in payload
    reason = payload.get("reason")
    by = payload.get("by")
    return Approval(
        approved=approved,
        reason=str(reason) if reason is not None else None,
        arguments=arguments if isinstance(arguments, dict) else None,
        by=str(by) if by is not None else None,
    )


def answer_payload(
    request: Request,
    *,
    decision: str | None = None,
    reason: str | None = None,
    arguments: Any = None,
    answer: str | None = None,
    by: str | None = None,
) -> str:
    """The signal payload (JSON) that answers ``request``, checked against it.

    Raises:
        InvalidAnswer: the answer does not fit the request, named in the message.
    """
    where = f"request {request.id!r} of run {request.run_id!r}"
    body: dict[str, Any]
    if request.kind == "question":
        body = _answer_body(request, where, decision, answer)
    else:
        body = _decision_body(request, where, decision, arguments)
    if reason is not None:
        body["reason"] = reason
    if by is not None:
        body["by"] = by
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False)


def _answer_body(
    request: Request, where: str, decision: str | None, answer: str | None
) -> dict[str, Any]:
    """A question's answer: non-empty text, one of the choices when it has any."""
    if decision is not None and decision != "answer":
        raise InvalidAnswer(
            f"{where} is a question: send an 'answer', not the decision {decision!r}"
        )
    if answer is None or not str(answer).strip():
        raise InvalidAnswer(f"{where} is a question: 'answer' must be a non-empty string")
    if request.choices is not None and answer not in request.choices:
        raise InvalidAnswer(
            f"{where}: {answer!r} is not one of the choices {list(request.choices)!r}"
        )
    return {"answer": answer}


def _decision_body(
    request: Request, where: str, decision: str | None, arguments: Any
) -> dict[str, Any]:
    """An approval's decision: arguments only with an edit, and an edit must carry them."""
    if decision not in _DECISIONS:
        raise InvalidAnswer(
            f"{where} is an approval: 'decision' must be one of {list(_DECISIONS)!r},"
            f" not {decision!r}"
        )
    if decision == "edit" and not isinstance(arguments, dict):
        raise InvalidAnswer(
            f"{where}: an 'edit' needs 'arguments', a JSON object of the new arguments,"
            f" not {arguments!r}"
        )
    if decision != "edit" and arguments is not None:
        raise InvalidAnswer(f"{where}: 'arguments' are only allowed with decision 'edit'")
    _check_budget_edit(request, where, decision, arguments)
    body: dict[str, Any] = {"decision": decision}
    if arguments is not None:
        body["arguments"] = arguments
    return body


def _check_budget_edit(request: Request, where: str, decision: str, arguments: Any) -> None:
    """A budget request (``budget:<limit>``) edited to a limit no higher than what the
    run has already used would be accepted and asked again at once: refuse it."""
    if not request.id.startswith("budget:"):
        return
    preview = request.preview if isinstance(request.preview, dict) else {}
    used = preview.get("used")
    limit = (arguments or {}).get("limit") if decision == "edit" else None
    if limit is None:
        return
    if isinstance(limit, bool) or not isinstance(limit, int | float):
        raise InvalidAnswer(f"{where}: 'limit' must be a number, not {limit!r}")
    if isinstance(used, int | float) and limit <= used:
        raise InvalidAnswer(
            f"{where}: the new {preview.get('limit', 'limit')} {limit!r} is not above the"
            f" {used:g} already used; set a higher limit, or reject to stop"
        )


def request_from_row(
    *,
    run_id: str,
    workflow: str,
    name: str,
    output: str,
    started_at: float,
    deadline: float | None,
) -> Request | None:
    """The request a started wait row describes, or ``None`` for a plain wait."""
    try:
        meta = json.loads(output).get("request")
    except (ValueError, AttributeError):
        return None
    if not isinstance(meta, dict):
        return None
    choices = meta.get("choices")
    on_timeout = meta.get("on_timeout")
    default_answer = meta.get("default_answer")
    return Request(
        run_id=run_id,
        workflow=workflow,
        id=name,
        kind="question" if meta.get("kind") == "question" else "approval",
        title=str(meta.get("title", name)),
        preview=meta.get("preview"),
        choices=tuple(str(c) for c in choices) if isinstance(choices, list) else None,
        created_at=started_at,
        deadline=deadline,
        on_timeout=on_timeout if on_timeout in _ON_TIMEOUT else None,
        default_answer=str(default_answer) if default_answer is not None else None,
    )
