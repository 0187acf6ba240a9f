"""A run's trace: one entry per journaled step, derived from the journal as stored.

Nothing extra is written while a run executes (the step overhead stays what it
is): latency comes from the row's timings, tokens from the usage a model step
journaled with its reply, cost from the price table, the error class from the
journaled error, and a tool call's input from the model reply that asked for it.
Every payload was redacted before it was journaled, so the trace is too.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Literal

from ..limits import Price, price_of
from ..storage import JournalRole, RunRecord, StepRecord
from ._jsontext import json_or_text
from ._names import StepRole, price_key, step_role, tool_of_name
from ._usage import reply_cost, reply_usage

__all__ = ["RunTrace", "TraceEntry", "TraceKind", "build_trace", "trace_entries"]

TraceKind = Literal["model", "tool", "step", "sleep", "signal", "now", "uuid", "random", "patch"]

_SUMMARY = 160


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceEntry:
    """One step of a run, as the trace shows it.

    Attributes:
        kind: ``"model"`` (a model call), ``"tool"``, ``"step"`` (any other
            ``ctx.step``), or the journal kind of a wait or a recorded value.
        name: the journal name (``model:openai:gpt-4.1``, ``tool:send_email``, ...).
        journal_role: the role the journal row carries (``ctx.step(..., role=...)``:
            ``model``, ``tool``, ``rate``, ``wait`` or ``step``); see :attr:`role`.
        position: ``"session:seq"``, the step's place in the journal.
        status: ``started``, ``retrying``, ``completed`` or ``failed``.
        attempt: the attempt that ended (or is running); ``attempt - 1`` retries.
        latency_s: seconds from the last attempt's start to its end (``None`` while
            it runs).
        input_summary / output_summary: short, redacted renderings.
        tokens_in / tokens_out / cost_usd: a model call's usage and its price.
        priced: a model call whose model has a price (journaled with the reply, or in
            the price table): its ``cost_usd`` is a cost, not an unknown shown as 0.
        model / tool: what was called.
        calls: a model step's requested tool calls, ``(name, arguments JSON)``.
        error_class / error_message: the step's journaled error: why it failed, or
            why its previous attempt did (for a step that then succeeded).
            ``error_type``: the error's class as journaled, with its module.
        copied: a fork copied this step from its source run and replays it: its
            tokens and cost were spent by the source, so they are 0 here.
        rate_limited: a model call the provider refused for rate (a 429): the
            step ended without spending an attempt and the run waited.
        rate_wait_s: seconds this step made the run wait for the rate limit (a
            booking's wait for its slot, or a rate-limit wait
            step's wait for the refusal's ``retry-after``); 0 otherwise.
    """

    session: int
    seq: int
    kind: TraceKind
    name: str
    status: str
    attempt: int
    started_at: float
    finished_at: float | None
    latency_s: float | None
    input_summary: str | None = None
    output_summary: str | None = None
    tokens_in: int = 0
    tokens_out: int = 0
    cost_usd: float = 0.0
    priced: bool = False
    model: str | None = None
    tool: str | None = None
    error_class: str | None = None
    error_message: str | None = None
    error_type: str | None = None
    calls: tuple[tuple[str, str], ...] = ()
    copied: bool = False
    rate_limited: bool = False
    rate_wait_s: float = 0.0
    journal_role: JournalRole = "step"

    @property
    def position(self) -> str:
        return f"{self.session}:{self.seq}"

    @property
    def retries(self) -> int:
        return max(0, self.attempt - 1)

    @property
    def role(self) -> StepRole:
        """What the step is to a person: see :data:`~mainspring.observability.StepRole`."""
        return step_role(self.kind, self.journal_role)


@dataclass(frozen=True, slots=True, kw_only=True)
class RunTrace:
    """A run and the trace of its steps, in journal order."""

    run: RunRecord
    entries: tuple[TraceEntry, ...]

    @property
    def tokens_in(self) -> int:
        return sum(e.tokens_in for e in self.entries)

    @property
    def tokens_out(self) -> int:
        return sum(e.tokens_out for e in self.entries)

    @property
    def cost_usd(self) -> float:
        return sum(e.cost_usd for e in self.entries)

    @property
    def unpriced(self) -> bool:
        """Tokens were spent on a model with no price: ``cost_usd`` leaves them out."""
        return any(not e.priced and (e.tokens_in or e.tokens_out) for e in self.entries)

    @property
    def rate_limited(self) -> int:
        """Model calls the provider refused for rate (429s)."""
        return sum(1 for e in self.entries if e.rate_limited)

    @property
    def rate_waits(self) -> int:
        """Waits for the rate limit (a slot not yet free, or a refusal's ``retry-after``)."""
        return sum(1 for e in self.entries if e.rate_wait_s > 0)

    @property
    def rate_wait_s(self) -> float:
        """Seconds the run waited for the rate limit, in all."""
        return sum(e.rate_wait_s for e in self.entries)

    @property
    def duration_s(self) -> float | None:
        """From creation to the end (``None`` while the run is unfinished)."""
        if self.run.finished_at is None:
            return None
        return self.run.finished_at - self.run.created_at

    def to_json(self) -> dict[str, Any]:
        """Plain JSON values (what ``mainspring trace --json`` prints)."""
        r = self.run
        return {
            "run": {
                "id": r.id,
                "workflow": r.workflow,
                "status": r.status,
                "session": r.session,
                "created_at": r.created_at,
                "finished_at": r.finished_at,
                "error": json_or_text(r.error),
            },
            "totals": {
                "steps": len(self.entries),
                "tokens_in": self.tokens_in,
                "tokens_out": self.tokens_out,
                "cost_usd": round(self.cost_usd, 6),
                "unpriced": self.unpriced,
                "retries": sum(e.retries for e in self.entries),
                "errors": sum(1 for e in self.entries if e.error_class),
                "rate_limited": self.rate_limited,
                "rate_waits": self.rate_waits,
                "rate_wait_s": round(self.rate_wait_s, 3),
                "duration_s": self.duration_s,
            },
            "steps": [
                {
                    "position": e.position,
                    "session": e.session,
                    "seq": e.seq,
                    "kind": e.kind,
                    "role": e.role,
                    "name": e.name,
                    "status": e.status,
                    "attempt": e.attempt,
                    "started_at": e.started_at,
                    "finished_at": e.finished_at,
                    "latency_s": e.latency_s,
                    "input": e.input_summary,
                    "output": e.output_summary,
                    "tokens_in": e.tokens_in,
                    "tokens_out": e.tokens_out,
                    "cost_usd": round(e.cost_usd, 8),
                    "priced": e.priced,
                    "model": e.model,
                    "tool": e.tool,
                    "error_class": e.error_class,
                    "error_message": e.error_message,
                    "tool_calls": [{"name": n, "arguments": a} for n, a in e.calls],
                    "copied": e.copied,
                    "rate_limited": e.rate_limited,
                    "rate_wait_s": round(e.rate_wait_s, 3),
                }
                for e in self.entries
            ],
        }


def build_trace(
    run: RunRecord, steps: list[StepRecord], prices: dict[str, Price] | None = None
) -> RunTrace:
    """The trace of ``run`` from its journal rows (``Store.load_steps``)."""
    return RunTrace(run=run, entries=tuple(trace_entries(steps, prices)))


def trace_entries(
    steps: list[StepRecord], prices: dict[str, Price] | None = None
) -> list[TraceEntry]:
    """Trace entries of journal rows in journal order (several runs may be mixed:
    each row's tool inputs are looked up in the model reply of its own run)."""
    out: list[TraceEntry] = []
    # Tool calls a model reply asked for and no tool step has taken yet, by run and name.
    waiting: dict[tuple[str, str], deque[str]] = {}
    for s in steps:
        kind: TraceKind = s.kind if s.kind != "step" else "step"
        latency = None if s.finished_at is None else max(0.0, s.finished_at - s.started_at)
        err = json_or_text(s.error)
        error_class = error_message = error_type = None
        if isinstance(err, dict):
            error_type = str(err.get("type", "Error"))
            error_class = error_type.rsplit(".", 1)[-1]
            error_message = _clip(str(err.get("message", "")))
        fields: dict[str, Any] = {}
        role = step_role(s.kind, s.role)
        if s.kind == "step" and role == "model":
            kind = "model"
            # Calls of the previous reply that no tool step took never ran (repaired,
            # refused, over a budget): the tool steps after this reply are its calls.
            for stale in [k for k in waiting if k[0] == s.run_id]:
                del waiting[stale]
            fields = _model_fields(s, prices, waiting)
            fields["rate_limited"] = error_class == "RateLimited" and s.status == "failed"
            if s.epoch == 0:
                # Epoch 0 is no worker's: the row was copied by a fork (every claim
                # bumps the epoch to 1 or more before anything is journaled).
                fields.update(tokens_in=0, tokens_out=0, cost_usd=0.0)
        elif s.kind == "step" and role == "tool":
            kind = "tool"
            tool = tool_of_name(s.name)
            queue = waiting.get((s.run_id, tool))
            fields = {
                "tool": tool,
                "input_summary": queue.popleft() if queue else None,
                "output_summary": _clip(s.output) if s.output is not None else None,
            }
        elif s.kind == "step" and role in ("rate", "wait"):
            fields = {
                "output_summary": _clip(s.output) if s.output is not None else None,
                "rate_wait_s": _rate_wait(s),
            }
        elif s.kind == "sleep":
            fields = {"input_summary": None if s.wake_at is None else f"until {s.wake_at:.3f}"}
        elif s.kind == "signal":
            fields = {"input_summary": f"wait for {s.name!r}", "output_summary": _clip(s.output)}
        else:
            fields = {"output_summary": _clip(s.output) if s.output is not None else None}
        out.append(
            TraceEntry(
                session=s.session,
                seq=s.seq,
                kind=kind,
                name=s.name,
                status=s.status,
                attempt=s.attempt,
                started_at=s.started_at,
                finished_at=s.finished_at,
                latency_s=latency,
                error_class=error_class,
                error_message=error_message,
                error_type=error_type,
                copied=s.epoch == 0,
                journal_role=s.role,
                **fields,
            )
        )
    return out


def _model_fields(
    s: StepRecord, prices: dict[str, Price] | None, waiting: dict[tuple[str, str], deque[str]]
) -> dict[str, Any]:
    model_id = price_key(s.name)
    reply = json_or_text(s.output) if s.status == "completed" else None
    if not isinstance(reply, dict):
        return {"model": model_id}
    usage = reply_usage(reply)
    calls = reply.get("tool_calls") or []
    parts: list[str] = []
    for c in calls:
        name, args = str(c.get("name", "")), str(c.get("arguments", ""))
        waiting.setdefault((s.run_id, name), deque()).append(_clip(args))
        parts.append(f"{name}({args})")
    text = reply.get("text")
    summary = " ".join(p for p in [text.strip() if isinstance(text, str) else "", *parts] if p)
    return {
        "model": model_id,
        "tokens_in": usage.input_tokens,
        "tokens_out": usage.output_tokens,
        "cost_usd": reply_cost(reply, model_id, usage, prices),
        "priced": isinstance(reply.get("cost_usd"), int | float)
        or price_of(model_id, prices) is not None,
        "output_summary": _clip(summary) if summary else None,
        "calls": tuple((str(c.get("name", "")), str(c.get("arguments", ""))) for c in calls),
    }


def _rate_wait(s: StepRecord) -> float:
    """How long a rate step made its run wait: a booking (role ``rate``) until its
    slot, a rate-limit wait (role ``wait``) until the wake time it journaled."""
    if s.status != "completed" or s.finished_at is None:
        return 0.0
    out = json_or_text(s.output)
    if isinstance(out, dict):  # a Booking (a cold limiter's "retry" too: it waits)
        waited = out.get("waited_s")
        return max(0.0, float(waited)) if isinstance(waited, int | float) else 0.0
    if isinstance(out, int | float) and s.role == "wait":
        return max(0.0, float(out) - s.finished_at)
    return 0.0


def _clip(text: str | None, width: int = _SUMMARY) -> str:
    if text is None:
        return ""
    one = " ".join(text.split())
    return one if len(one) <= width else one[: width - 1] + "…"
