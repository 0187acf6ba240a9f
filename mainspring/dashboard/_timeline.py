"""The run page's timeline: a run's trace as a person reads it.

An agent's run is grouped by turn: one model call and what it led to (its tool calls,
approvals, waits). The bookkeeping that keeps a run durable (recorded ``now``/``uuid``/
``random`` values, rate-limit bookings) is hidden unless asked for. Each row is a bar on
a time axis: execution, waiting (a sleep, a signal, a rate-limit wait) and the earlier
attempts of a retried step are drawn apart. Filters and paging happen here, so the page
renders only the rows it shows (a 1,200-step run draws one page of it).

Pure functions of the trace entries: what a step *is* comes from
:func:`mainspring.observability.step_role`, never from names parsed here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Literal
from urllib.parse import urlencode

from ..observability import StepRole, TraceEntry, model_of

__all__ = [
    "KINDS",
    "PAGE_ROWS",
    "PAGE_TURNS",
    "Axis",
    "Filters",
    "Group",
    "Row",
    "Segment",
    "Timeline",
    "Turn",
    "build_timeline",
    "duration",
    "group_turns",
    "money",
]

PAGE_TURNS = 25
"""Turns on one page of an agent's timeline."""
PAGE_ROWS = 200
"""Rows on one page of a timeline without turns (a plain workflow)."""
KINDS: tuple[StepRole, ...] = ("model", "tool", "step", "wait", "child")
"""The kinds a person can filter by; ``rate`` and ``internal`` rows come with ``internal``."""
_HIDDEN: frozenset[StepRole] = frozenset({"rate", "internal"})
_MAX_PAGE = 1_000_000


def _flag(value: str | None) -> bool:
    return value is not None and value.lower() in ("1", "true", "on", "yes")


def _number(value: str | None, low: int = 0) -> int | None:
    if value is None or not value.strip().isdigit() or len(value.strip()) > 7:
        return None  # a person's typo (or a crafted URL) is ignored, not a 422
    return max(low, int(value))


@dataclass(frozen=True, slots=True, kw_only=True)
class Filters:
    """What the page shows, from its query string (links and a plain GET form: the
    filters work without JavaScript).

    Attributes:
        errors: only failed rows and rows whose earlier attempts failed.
        kind: only rows of this role (``model``, ``tool``, ``step``, ``wait``).
        first / last: only turns in this range (inclusive; turn 0 is what ran
            before the first model call).
        internal: show the bookkeeping rows too.
        page: 1-based; ``None``: the last page, the live end of the run (where a
            long run's newest turns are), which is where its page opens.
        zoom: draw each turn on its own time axis (``scale=turn``) instead of one axis
            for the page: a short turn's calls are wide enough to read, next to a
            turn that waited an hour for a person.
    """

    errors: bool = False
    kind: StepRole | None = None
    first: int | None = None
    last: int | None = None
    internal: bool = False
    page: int | None = None
    zoom: bool = False

    @classmethod
    def parse(cls, params: Mapping[str, str]) -> Filters:
        """Filters from query parameters; values that make no sense are ignored."""
        kind = params.get("kind")
        return cls(
            errors=_flag(params.get("errors")),
            kind=next((k for k in KINDS if k == kind), None),
            first=_number(params.get("first")),
            last=_number(params.get("last")),
            internal=_flag(params.get("internal")),
            page=None if (n := _number(params.get("page"), 1)) is None else min(n, _MAX_PAGE),
            zoom=params.get("scale") == "turn",
        )

    def query(self, **changes: object) -> str:
        """The query string (with its ``?``) of these filters with ``changes``; a
        change of anything but the page goes back to the live end (the last page)."""
        if "page" not in changes:
            changes["page"] = None
        f = replace(self, **changes)  # type: ignore[arg-type]
        pairs: list[tuple[str, object]] = []
        if f.errors:
            pairs.append(("errors", 1))
        if f.kind:
            pairs.append(("kind", f.kind))
        if f.first is not None:
            pairs.append(("first", f.first))
        if f.last is not None:
            pairs.append(("last", f.last))
        if f.internal:
            pairs.append(("internal", 1))
        if f.zoom:
            pairs.append(("scale", "turn"))
        if f.page is not None:
            pairs.append(("page", f.page))
        return "?" + urlencode(pairs) if pairs else "?"

    @property
    def narrowed(self) -> bool:
        """Whether some rows are left out by a filter (not counting ``internal``)."""
        return (
            self.errors
            or self.kind is not None
            or self.first is not None
            or (self.last is not None)
        )

    def keeps(self, row: Row) -> bool:
        """Whether ``row`` passes these filters."""
        if row.role in _HIDDEN and not self.internal:
            return False
        if self.kind is not None and row.role != self.kind:
            return False
        if self.errors and not row.error:
            return False
        if row.turn is not None:
            if self.first is not None and row.turn < self.first:
                return False
            if self.last is not None and row.turn > self.last:
                return False
        return True


@dataclass(frozen=True, slots=True, kw_only=True)
class Row:
    """One journal row, placed in time.

    Attributes:
        role: as drawn: a rate-limit booking that made the run wait is a ``wait``.
        turn: the agent turn it belongs to (``None`` in a run without model calls).
        label / detail: what the row is (a model is its logical name, never a URL),
            and a short summary (a tool's arguments, a model's reply).
        start_s: the (last attempt's) start, seconds after the run's first step.
        took_s: how long it ran (``None`` while it runs: ``running``).
        waited_s: the rate-limit wait this row made the run do after it.
        retry_s: seconds before the last attempt that earlier attempts and their
            back-off took (from the end of the journal row before it).
        error: it failed, or an earlier attempt did, or the provider refused it.
    """

    entry: TraceEntry
    role: StepRole
    turn: int | None
    label: str
    detail: str
    start_s: float
    took_s: float | None
    running: bool
    waited_s: float = 0.0
    retry_s: float = 0.0
    error: bool = False

    @property
    def end_s(self) -> float:
        return self.start_s + (self.took_s or 0.0) + self.waited_s

    @property
    def dom_id(self) -> str:
        return f"step-{self.entry.session}-{self.entry.seq}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Turn:
    """One model call and what it led to, with its totals."""

    number: int
    rows: tuple[Row, ...]
    model: str | None = None
    tokens_in: int = 0
    tokens_out: int = 0
    cost_usd: float = 0.0
    model_s: float = 0.0
    tools: int = 0
    tool_errors: int = 0
    waited_s: float = 0.0
    retries: int = 0
    errors: int = 0
    status: Literal["completed", "failed", "running"] = "completed"
    start_s: float = 0.0
    end_s: float = 0.0

    @property
    def latency_s(self) -> float:
        """From the turn's first row to its last, waits included."""
        return max(0.0, self.end_s - self.start_s)


@dataclass(frozen=True, slots=True)
class Segment:
    """A piece of a bar: ``cls`` is ``run``, ``wait``, ``retry`` or ``turn``;
    ``left`` and ``width`` are percentages of the axis."""

    cls: str
    left: float
    width: float
    title: str


@dataclass(frozen=True, slots=True)
class Axis:
    """The page's time axis: seconds after the run's first step, ``start`` to ``end``."""

    start: float
    end: float

    @property
    def span(self) -> float:
        return max(self.end - self.start, 1e-3)

    def _pct(self, t: float) -> float:
        return round(100.0 * min(max(t - self.start, 0.0), self.span) / self.span, 2)

    def segment(self, cls: str, start: float, seconds: float, title: str) -> Segment:
        left = self._pct(start)
        return Segment(cls, left, max(0.0, round(self._pct(start + seconds) - left, 2)), title)

    def bars(self, row: Row) -> list[Segment]:
        """The pieces of a row's bar: earlier attempts, the step (running, or
        waiting for a signal or a timer), then the rate-limit wait it caused."""
        out: list[Segment] = []
        e = row.entry
        if row.retry_s > 0:
            out.append(
                self.segment(
                    "retry",
                    row.start_s - row.retry_s,
                    row.retry_s,
                    f"attempts 1-{e.attempt - 1} and back-off: {duration(row.retry_s)}",
                )
            )
        took = row.took_s or 0.0
        waiting = _waits(row)
        cls = "wait" if waiting else "fail" if e.status == "failed" else "run"
        what = "waited" if waiting else "ran"
        out.append(self.segment(cls, row.start_s, took, f"{what} {duration(took)}"))
        if row.waited_s > 0:
            out.append(
                self.segment(
                    "wait",
                    row.start_s + took,
                    row.waited_s,
                    f"rate-limit wait {duration(row.waited_s)}",
                )
            )
        return out

    def ticks(self, count: int = 5) -> list[tuple[float, str]]:
        """Up to ``count`` evenly spaced labels (percent, ``"+12 s"``): time since the
        run's first step, as precise as the span needs. Long labels (a run of minutes
        or hours, ``"+1 h 05 m"``) come fewer, so that they never run into each other
        in the axis's column (the first is left-aligned, the last right-aligned, the
        others centred on their place)."""

        def labels(n: int) -> list[tuple[float, str]]:
            out = []
            for i in range(n):
                at = self.start + self.span * i / (n - 1)
                label = duration(at) if self.span < 10 else _rounded(at)
                out.append((100.0 * i / (n - 1), "+" + label))
            return out

        out = labels(count)
        if count > 3 and max(len(label) for _, label in out) > 7:
            out = labels(3)
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class Group:
    """Rows shown together: a turn's (``turn`` set), or a page of a run without turns;
    ``axis``: the time axis their bars are drawn on."""

    turn: Turn | None
    rows: tuple[Row, ...]
    axis: Axis


@dataclass(frozen=True, slots=True, kw_only=True)
class Timeline:
    """One page of a run's timeline, and what the filters left out."""

    filters: Filters
    agent: bool
    groups: tuple[Group, ...]
    turns: tuple[Turn, ...] = field(repr=False)
    total_steps: int
    hidden: int
    matched: int
    page: int
    pages: int
    axis: Axis

    @property
    def shown(self) -> int:
        return sum(len(g.rows) for g in self.groups)


def duration(seconds: float) -> str:
    """A short duration that never reads as negative: ``850 ms``, ``2.41 s``,
    ``3 m 05 s``, ``2 h 10 m``."""
    s = max(0.0, seconds)
    if s < 1.0:
        return f"{s * 1000:.0f} ms"
    if s < 60.0:
        return f"{s:.2f} s"
    if s < 3600.0:
        return f"{int(s // 60)} m {int(s % 60):02d} s"
    return f"{int(s // 3600)} h {int(s % 3600 // 60):02d} m"


def _rounded(seconds: float) -> str:
    s = round(max(0.0, seconds))
    if s < 60:
        return f"{s} s"
    return duration(s) if s < 3600 else f"{s // 3600} h {s % 3600 // 60:02d} m"


def money(value: float) -> str:
    """Dollars with the digits a small cost needs: ``$0.000121``, ``$0.0350``, ``$2.10``."""
    if value == 0:
        return "$0"
    if value >= 1:
        return f"${value:.2f}"
    return f"${value:.4f}" if value >= 0.01 else f"${value:.6f}"


def _until(text: str | None) -> str | None:
    """A wake time journaled as a Unix time (a sleep's ``until 1796667497.39``, a
    rate-limit wait's output), as a person reads it; ``None``: it is not one."""
    raw = (text or "").removeprefix("until ").strip()
    try:
        at = float(raw)
    except ValueError:
        return None
    if not 1e8 < at < 1e11:  # not an epoch time (a count, a small number)
        return None
    return "until " + datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _label(e: TraceEntry, role: StepRole) -> tuple[str, str]:
    if role == "model":
        return model_of(e.name), e.output_summary or ""
    if role == "tool":
        return e.tool or e.name, e.input_summary or ""
    if e.kind == "signal":
        return e.name, e.output_summary or ""
    if e.kind == "sleep":
        return "sleep", _until(e.input_summary) or e.input_summary or ""
    if role in ("wait", "rate"):
        return e.name, _until(e.output_summary) or e.output_summary or ""
    return e.name, e.output_summary or ""


def _rows(entries: Sequence[TraceEntry], turns: Sequence[int | None], now: float) -> list[Row]:
    t0 = min((e.started_at for e in entries), default=now)
    out: list[Row] = []
    previous_end: float | None = None
    for e, turn in zip(entries, turns, strict=True):
        role = e.role
        if role == "rate" and e.rate_wait_s > 0:
            role = "wait"  # the booking made the run wait for its slot: that is what it is
        running = e.finished_at is None
        took = e.latency_s if not running else max(0.0, now - e.started_at)
        retry = 0.0
        if e.attempt > 1 and previous_end is not None and previous_end < e.started_at:
            retry = e.started_at - previous_end
        label, detail = _label(e, role)
        out.append(
            Row(
                entry=e,
                role=role,
                turn=turn,
                label=label,
                detail=detail,
                start_s=e.started_at - t0,
                took_s=took,
                running=running,
                waited_s=e.rate_wait_s,
                retry_s=retry,
                error=e.status == "failed" or e.error_class is not None or e.rate_limited,
            )
        )
        if e.finished_at is not None:
            previous_end = e.finished_at + e.rate_wait_s
    return out


def group_turns(entries: Sequence[TraceEntry]) -> list[int | None]:
    """The turn of each entry: turn ``n`` starts with the ``n``-th model call (a call
    sent again after the provider refused it is the same turn). Bookkeeping and
    rate-limit waits just before a model call belong to that call's turn; tool calls,
    approvals and other steps after it to its turn; what runs before the first model
    call is turn 0. A run without model calls has no turns (all ``None``)."""
    if not any(e.role == "model" for e in entries):
        return [None] * len(entries)
    out: list[int | None] = [None] * len(entries)
    turn = 0
    lead_in: list[int] = []  # rows waiting to see whether a model call follows them
    refused = False  # the turn's last model call failed: the next one is its retry
    for i, e in enumerate(entries):
        role = e.role
        if role == "model":
            if not (refused and turn > 0):
                turn += 1
            for j in lead_in:
                out[j] = turn
            lead_in.clear()
            out[i] = turn
            refused = e.status == "failed"
        elif role in _HIDDEN or (role == "wait" and e.kind == "step"):
            lead_in.append(i)
        else:
            for j in lead_in:
                out[j] = turn
            lead_in.clear()
            out[i] = turn
            refused = refused and role == "wait"
    for j in lead_in:
        out[j] = turn
    return out


def _waits(row: Row) -> bool:
    """Whether the row's own time was waiting (a sleep, a signal), not work."""
    return row.role == "wait" and row.entry.kind in ("sleep", "signal")


def _turn(number: int, rows: Sequence[Row]) -> Turn:
    models = [r for r in rows if r.role == "model"]
    tools = [r for r in rows if r.role == "tool"]
    failed = any(r.entry.status == "failed" and not r.entry.rate_limited for r in rows)
    last_model = models[-1] if models else None
    if last_model is not None and last_model.entry.status == "failed":
        failed = True
    return Turn(
        number=number,
        rows=tuple(rows),
        model=models[0].label if models else None,
        tokens_in=sum(r.entry.tokens_in for r in models),
        tokens_out=sum(r.entry.tokens_out for r in models),
        cost_usd=sum(r.entry.cost_usd for r in models),
        model_s=sum(r.took_s or 0.0 for r in models),
        tools=len(tools),
        tool_errors=sum(1 for r in tools if r.entry.status == "failed"),
        waited_s=sum(r.waited_s for r in rows) + sum(r.took_s or 0.0 for r in rows if _waits(r)),
        retries=sum(r.entry.retries for r in rows) + sum(1 for r in models if r.entry.rate_limited),
        errors=sum(1 for r in rows if r.error),
        status="running" if any(r.running for r in rows) else "failed" if failed else "completed",
        start_s=min((r.start_s - r.retry_s for r in rows), default=0.0),
        end_s=max((r.end_s for r in rows), default=0.0),
    )


def _axis(spans: Sequence[tuple[float, float]]) -> Axis:
    return Axis(min((s for s, _ in spans), default=0.0), max((e for _, e in spans), default=0.0))


def build_timeline(
    entries: Sequence[TraceEntry], filters: Filters | None = None, *, now: float
) -> Timeline:
    """The page of ``entries`` that ``filters`` asks for. ``now``: where a step that is
    still running ends for the drawing."""
    filters = filters or Filters()
    turn_of = group_turns(entries)
    rows = _rows(entries, turn_of, now)
    hidden = sum(1 for r in rows if r.role in _HIDDEN) if not filters.internal else 0
    agent = any(t is not None for t in turn_of)
    turns: list[Turn] = []
    if agent:
        by_turn: dict[int, list[Row]] = {}
        for r in rows:
            by_turn.setdefault(r.turn or 0, []).append(r)
        turns = [_turn(n, rs) for n, rs in sorted(by_turn.items())]
        kept = [(t, tuple(r for r in t.rows if filters.keeps(r))) for t in turns]
        units = [(t, rs) for t, rs in kept if rs]
        matched = sum(len(rs) for _, rs in units)
        pages = max(1, -(-len(units) // PAGE_TURNS))
        page = pages if filters.page is None else min(filters.page, pages)
        chosen = units[(page - 1) * PAGE_TURNS : page * PAGE_TURNS]
        axis = _axis([(t.start_s, t.end_s) for t, _ in chosen])
        groups = tuple(
            Group(turn=t, rows=rs, axis=Axis(t.start_s, t.end_s) if filters.zoom else axis)
            for t, rs in chosen
        )
    else:
        shown = [r for r in rows if filters.keeps(r)]
        matched = len(shown)
        pages = max(1, -(-matched // PAGE_ROWS))
        page = pages if filters.page is None else min(filters.page, pages)
        part = tuple(shown[(page - 1) * PAGE_ROWS : page * PAGE_ROWS])
        axis = _axis([(r.start_s - r.retry_s, r.end_s) for r in part])
        groups = (Group(turn=None, rows=part, axis=axis),) if part else ()
    return Timeline(
        filters=replace(filters, page=page),
        agent=agent,
        groups=groups,
        turns=tuple(turns),
        total_steps=len(entries),
        hidden=hidden,
        matched=matched,
        page=page,
        pages=pages,
        axis=axis,
    )
