"""``doctor``: explain a stuck or failed run with the seeds' failure table.

Seed 000's table of long-horizon failures, each with what to check next:

============================  ==========================================================
stalled (stopped half-way)    a run that stopped moving: a lease that expired, a step
                              with no end, retries exhausted on timeouts, dead-lettered,
                              a budget that ended it with a partial result
looping (same action)         the same tool call with the same arguments again and
                              again, or the loop guard's ``LoopDetected``
stale_state                   the plan/state not updated for many turns while tools ran,
                              or a read that returned something else the second time
ignored_tool_error            a tool failed and the run went on without that tool ever
                              succeeding afterwards
context_bloat                 prompts growing turn after turn, or ``ContextOverflow``
done_but_wrong                "done" with plan items still open, rejected answers, or
                              failed tool calls behind the answer
invalid_calls                 the model could not produce a valid call: the run failed
                              with ``ModelOutputError`` after ``max_repairs`` repairs
nondeterminism                not the agent's failure but the runtime's: replay met a
                              step other than the journaled one (``NondeterminismError``)
============================  ==========================================================

Every finding cites the steps (``session:seq``) it rests on.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ._jsontext import json_or_text
from ._trace import RunTrace, TraceEntry

__all__ = ["Diagnosis", "Finding", "FindingKind", "Progress", "diagnose", "progress"]

FindingKind = Literal[
    "stalled",
    "looping",
    "stale_state",
    "ignored_tool_error",
    "context_bloat",
    "done_but_wrong",
    "invalid_calls",
    "nondeterminism",
]

TITLES: dict[str, str] = {
    "stalled": "stopped half-way",
    "looping": "repeating the same action",
    "stale_state": "acting on stale state",
    "ignored_tool_error": "tool error ignored",
    "context_bloat": "context bloated",
    "done_but_wrong": '"done" but possibly wrong',
    "invalid_calls": "the model could not produce a valid call",
    "nondeterminism": "the workflow's steps changed under the run (NondeterminismError)",
}
_TRANSIENT = frozenset(
    {"StepTimeout", "TimeoutError", "TransientError", "RateLimited", "WorkerLost", "DeadLettered"}
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Finding:
    """One row of the failure table that this run matches."""

    kind: FindingKind
    title: str
    evidence: tuple[str, ...]
    next_steps: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Diagnosis:
    """What ``doctor`` concluded about a run."""

    run_id: str
    status: str
    summary: str
    findings: tuple[Finding, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "status": self.status,
            "summary": self.summary,
            "findings": [
                {
                    "kind": f.kind,
                    "title": f.title,
                    "evidence": list(f.evidence),
                    "next": list(f.next_steps),
                }
                for f in self.findings
            ],
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class Progress:
    """Where a run is: what ``mainspring tail`` shows."""

    status: str
    steps: int
    current: str | None
    plan_done: int
    plan_total: int
    tokens_in: int
    tokens_out: int
    cost_usd: float
    errors: int


@dataclass(frozen=True, slots=True)
class _Call:
    entry: TraceEntry  # the model step that asked for it
    name: str
    arguments: str


def progress(trace: RunTrace) -> Progress:
    """The run's progress, from its trace."""
    plan = _last_plan(trace.entries)
    last = trace.entries[-1] if trace.entries else None
    return Progress(
        status=trace.run.status,
        steps=len(trace.entries),
        current=None if last is None else f"{last.position} {last.name} ({last.status})",
        plan_done=sum(1 for p in plan if p.get("status") == "done"),
        plan_total=len(plan),
        tokens_in=trace.tokens_in,
        tokens_out=trace.tokens_out,
        cost_usd=trace.cost_usd,
        errors=sum(1 for e in trace.entries if e.status == "failed"),
    )


def diagnose(trace: RunTrace, *, now: float, stall_after_s: float = 600.0) -> Diagnosis:
    """Match a run's trace against the failure table.

    Args:
        trace: the run and its steps.
        now: the current time (for leases and quiet runs).
        stall_after_s: an unfinished run with no journal activity for this long
            counts as stalled.
    """
    entries = trace.entries
    calls = _tool_calls(entries)
    findings = [
        f
        for f in (
            _nondeterminism(trace),
            _invalid_calls(trace),
            _stalled(trace, now, stall_after_s),
            _looping(trace, calls),
            _stale_state(trace, calls),
            _ignored_tool_error(trace),
            _context_bloat(trace),
            _done_but_wrong(trace),
        )
        if f is not None
    ]
    run = trace.run
    if findings:
        summary = "; ".join(f.title for f in findings)
    elif run.status == "failed":
        err = json_or_text(run.error)
        summary = "failed with no pattern from the failure table: " + _error_text(err)
    else:
        summary = f"{run.status}; nothing from the failure table found"
    return Diagnosis(run_id=run.id, status=run.status, summary=summary, findings=tuple(findings))


# -- the table, row by row --------------------------------------------------------------


def _invalid_calls(trace: RunTrace) -> Finding | None:
    err = json_or_text(trace.run.error)
    if trace.run.status != "failed" or not isinstance(err, dict):
        return None
    if _short(err.get("type")) != "ModelOutputError":
        return None
    return _finding(
        "invalid_calls",
        [str(err.get("message", ""))],
        [
            "read the last repair and the call it was about: a tool schema the model "
            "misreads (rename or describe the parameter, add an example in the docstring), "
            "a required argument it never has, or a model too weak for the tool set",
            "raise max_repairs in app.agent(...) if the model gets there with more tries, "
            f"then `mainspring retry {trace.run.id}`",
        ],
    )


def _nondeterminism(trace: RunTrace) -> Finding | None:
    err = json_or_text(trace.run.error)
    refused = trace.run.wait_reason == "replay" and not trace.run.finished
    if not (trace.run.status == "failed" or refused) or not isinstance(err, dict):
        return None
    if _short(err.get("type")) != "NondeterminismError":
        return None
    where = err.get("step") or "?"
    evidence = [f"{where}: {err.get('message', '')}"]
    note = err.get("refused")
    if refused and isinstance(note, dict):
        evidence.append(
            f"no worker has replayed it: refused {note.get('count')} time(s), last by "
            f"{note.get('worker') or '?'}"
            + (", now parked (waiting)" if note.get("parked") else "")
        )
        return _finding(
            "nondeterminism",
            evidence,
            [
                "it is not failed: it waits for a worker whose code can replay it (a "
                "rolling deploy runs old and new code side by side; a worker that cannot "
                "replay a run leaves it to the others)",
                "if the workers that can are gone: deploy code that matches its journal "
                "(the code that started it, or the one that took its patch), or "
                f"`mainspring cancel {trace.run.id}`, or `mainspring fork {trace.run.id} "
                "--from-step N` to keep steps 0..N under the code you have",
                'next time, ship the change under runs in flight: `if ctx.patched("change-id"):`'
                " new steps, else the old ones",
            ],
        )
    return _finding(
        "nondeterminism",
        evidence,
        [
            "the code (or a step name built from configuration) changed while the run was "
            "in flight; a step's name must be what the workflow decided, never a URL, key "
            "or setting (pass name= to ctx.step)",
            "to finish it without paying again: deploy the code that started it, then "
            f"`mainspring retry {trace.run.id}` (every step before {where} replays from the "
            "journal)",
            f"to keep the new code: `mainspring retry {trace.run.id}` drops the journal from "
            f"{where} on and runs those steps again (their model calls are paid again), or "
            f"`mainspring fork {trace.run.id} --from-step N` keeps steps 0..N in a new run",
            'next time, ship the change under runs in flight: `if ctx.patched("change-id"):`'
            " new steps, else the old ones (runs from before the change take the old "
            "branch), or declare App(version=...) so old workers drain the old runs",
        ],
    )


def _stalled(trace: RunTrace, now: float, quiet_s: float) -> Finding | None:
    run, entries = trace.run, trace.entries
    evidence: list[str] = []
    err = json_or_text(run.error)
    err_type = _short(err.get("type")) if isinstance(err, dict) else None
    if run.status == "running" and run.lease_until is not None and run.lease_until < now:
        evidence.append(
            f"status running but its lease expired {now - run.lease_until:.0f}s ago "
            f"(owner {run.owner}): its worker died or hangs"
        )
    last_activity = max(
        [run.updated_at, *(e.finished_at or e.started_at for e in entries)], default=run.updated_at
    )
    if run.status in ("running", "queued") and now - last_activity > quiet_s and not evidence:
        evidence.append(f"{run.status} with no journal activity for {now - last_activity:.0f}s")
    hanging = [e for e in entries if e.status == "started" and e.finished_at is None]
    if hanging and (run.status == "failed" or evidence):
        e = hanging[-1]
        evidence.append(f"step {e.position} {e.name} started (attempt {e.attempt}) and never ended")
    if err_type == "DeadLettered":
        evidence.append(f"dead-lettered: {_error_text(err)}")
    elif run.status == "failed":
        failed = [e for e in entries if e.status == "failed" and e.error_class in _TRANSIENT]
        if failed and err_type == "StepFailed":
            e = failed[-1]
            evidence.append(
                f"step {e.position} {e.name} failed for good after {e.attempt} attempt(s) "
                f"of {e.error_class}: {e.error_message}"
            )
    output = json_or_text(run.output)
    if run.status == "succeeded" and isinstance(output, dict) and output.get("status") == "partial":
        evidence.append(f"the agent stopped with a partial result: {output.get('reason')}")
    if not evidence:
        return None
    return _finding(
        "stalled",
        evidence,
        [
            "is a worker running for this workflow? (`mainspring worker MODULE:APP`)",
            "check the failing step's timeout and the model/tool endpoint it calls "
            "(`mainspring trace RUN` shows each attempt's error)",
            "once fixed, resume it from the failing step: `mainspring retry RUN`",
            "a budget stop: raise the limit (Limits) or answer the budget question",
        ],
    )


def _looping(trace: RunTrace, calls: list[_Call]) -> Finding | None:
    evidence: list[str] = []
    err = json_or_text(trace.run.error)
    if isinstance(err, dict) and _short(err.get("type")) == "LoopDetected":
        evidence.append(f"the loop guard stopped the run: {err.get('message')}")
    acting = [c for c in calls if c.name not in ("update_state", "finish")]
    run_len, best = 1, (1, acting[0] if acting else None)
    for prev, cur in itertools.pairwise(acting):
        same = (prev.name, prev.arguments) == (cur.name, cur.arguments)
        run_len = run_len + 1 if same else 1
        if run_len > best[0]:
            best = (run_len, cur)
    if best[0] >= 3 and best[1] is not None:
        c = best[1]
        evidence.append(
            f"{c.name}({c.arguments[:80]}) called {best[0]} times in a row "
            f"(last asked at {c.entry.position})"
        )
    # The same step failing with the same error on attempt after attempt.
    for e in trace.entries:
        if e.attempt >= 4 and e.error_class:
            evidence.append(
                f"step {e.position} {e.name} ran {e.attempt} attempts, last error "
                f"{e.error_class}: {e.error_message}"
            )
            break
    if not evidence:
        return None
    return _finding(
        "looping",
        evidence,
        [
            "does the repeated call's result change anything the agent can see? Compare the "
            "outputs of the repeated steps (`mainspring trace RUN`)",
            "make the tool's result say what changed (or that nothing did) and record "
            "progress with update_state",
            "cap it: Limits(max_steps=..., max_tool_calls=...); fork from before the loop "
            "with an edited result: `mainspring fork RUN --from-step N --edit-state JSON`",
        ],
    )


def _stale_state(trace: RunTrace, calls: list[_Call]) -> Finding | None:
    # Only a run that ended without success has a failure to explain. One that succeeded
    # passed its completion checks, and one still running or waiting is as healthy as
    # its progress says (stalled and looping watch that): a plan never written down or
    # a read that changed (polling a status) is how healthy agents work too. Flagging a
    # live agent for it put a false warning at the top of its page.
    # (done_but_wrong looks at succeeded runs.)
    if trace.run.status not in ("failed", "cancelled"):
        return None
    evidence: list[str] = []
    model_turns = [e for e in trace.entries if e.kind == "model" and e.status == "completed"]
    updates = [i for i, e in enumerate(model_turns) if _asks(calls, e, "update_state")]
    tool_turns = sum(
        1
        for e in model_turns
        if any(c.entry is e and c.name not in ("update_state", "finish") for c in calls)
    )
    if len(model_turns) >= 8 and tool_turns >= 6:
        since = len(model_turns) - 1 - (updates[-1] if updates else -1)
        if since >= 8:
            where = "never" if not updates else f"not for the last {since} turns"
            evidence.append(
                f"the plan/state was {where} updated (update_state) over "
                f"{len(model_turns)} model turns with tool calls in {tool_turns}"
            )
    # The same read answered differently: whatever was decided on the first answer
    # rests on state that has since changed.
    first: dict[tuple[str, str], TraceEntry] = {}
    by_input = [e for e in trace.entries if e.kind == "tool" and e.status == "completed"]
    for e in by_input:
        key = (e.name, e.input_summary or "")
        seen = first.get(key)
        if seen is None:
            first[key] = e
        elif e.input_summary and seen.output_summary != e.output_summary:
            evidence.append(
                f"{e.name}({e.input_summary[:60]}) answered differently at {seen.position} "
                f"and {e.position}: steps between them acted on the older answer"
            )
            break
    if not evidence:
        return None
    return _finding(
        "stale_state",
        evidence,
        [
            "is the state kept outside the model? Plan with update_state "
            "(App.agent(planning=True)) and record facts as they are established",
            "re-read what can change before acting on it (write tools should check the "
            "current value, or take an expected version)",
            "check what the model was shown: the state block and the last turns",
        ],
    )


def _ignored_tool_error(trace: RunTrace) -> Finding | None:
    evidence: list[str] = []
    entries = trace.entries
    for i, e in enumerate(entries):
        if e.kind != "tool" or e.status != "failed":
            continue
        later = entries[i + 1 :]
        recovered = any(x.name == e.name and x.status == "completed" for x in later)
        went_on = any(x.kind == "model" for x in later)
        if went_on and not recovered:
            evidence.append(
                f"tool step {e.position} {e.name} failed ({e.error_class}: {e.error_message}) "
                "and the run went on without that tool ever succeeding"
            )
    if not evidence:
        return None
    return _finding(
        "ignored_tool_error",
        evidence[:5],
        [
            "does the tool's error say clearly that it failed and why? (its result is what "
            "the model sees)",
            "should the failure stop the run? Raise a non-retryable error type, or add a "
            "completion validator that checks the tool's effect",
            "fix the cause and re-run from before the call: `mainspring fork RUN --from-step N`",
        ],
    )


def _context_bloat(trace: RunTrace) -> Finding | None:
    evidence: list[str] = []
    if any(e.error_class == "ContextOverflow" for e in trace.entries):
        e = next(e for e in trace.entries if e.error_class == "ContextOverflow")
        evidence.append(f"the model refused the prompt as too long at {e.position}")
    prompts = [e.tokens_in for e in trace.entries if e.kind == "model" and e.tokens_in]
    if len(prompts) >= 6:
        head = sorted(prompts[:3])[1]
        tail = prompts[-1]
        rising = sum(1 for a, b in itertools.pairwise(prompts) if b > a)
        if head and tail >= 4 * head and tail >= 4000 and rising >= 0.7 * (len(prompts) - 1):
            evidence.append(
                f"prompt tokens grew from ~{head:,} to {tail:,} over {len(prompts)} model "
                f"calls, rising in {rising} of {len(prompts) - 1}"
            )
    if not evidence:
        return None
    return _finding(
        "context_bloat",
        evidence,
        [
            "what is each request carrying? Keep the last few turns verbatim and the rest as "
            "state and a summary: ContextPolicy(recent_turns=..., max_input_tokens=...)",
            "shorten tool results (max_result_chars) so old results fold to summaries",
            "bound sessions with a hand-off: App.agent(session_tokens=...)",
        ],
    )


def _done_but_wrong(trace: RunTrace) -> Finding | None:
    run = trace.run
    output = json_or_text(run.output)
    if run.status != "succeeded" or not isinstance(output, dict) or output.get("status") != "done":
        return None
    evidence: list[str] = []
    state = output.get("state") if isinstance(output.get("state"), dict) else {}
    plan = state.get("plan") or [] if isinstance(state, dict) else []
    open_items = [p for p in plan if isinstance(p, dict) and p.get("status") in ("todo", "doing")]
    if open_items:
        texts = ", ".join(repr(p.get("text")) for p in open_items[:3])
        evidence.append(
            f"declared done with {len(open_items)} of {len(plan)} plan items open: {texts}"
        )
    failed_tools = [e for e in trace.entries if e.kind == "tool" and e.status == "failed"]
    if failed_tools:
        evidence.append(
            f"{len(failed_tools)} tool call(s) failed along the way (first: "
            f"{failed_tools[0].position} {failed_tools[0].name})"
        )
    if isinstance(state, dict) and not plan and int(state.get("tool_calls") or 0) == 0:
        evidence.append("declared done without calling a single tool")
    if not evidence:
        return None
    return _finding(
        "done_but_wrong",
        evidence,
        [
            "what says the task is complete? Add completion validators to the agent "
            "(App.agent(validators=[...])) that check the result, not the wording",
            "check the answer against the plan and the facts in the result's state",
            "spot-check the effects (the tool calls of `mainspring trace RUN`)",
        ],
    )


# -- helpers ----------------------------------------------------------------------------


def _finding(kind: FindingKind, evidence: Sequence[str], next_steps: Sequence[str]) -> Finding:
    return Finding(
        kind=kind, title=TITLES[kind], evidence=tuple(evidence), next_steps=tuple(next_steps)
    )


def _tool_calls(entries: Sequence[TraceEntry]) -> list[_Call]:
    """The tool calls the model asked for, in order, from the journaled replies."""
    calls: list[_Call] = []
    for e in entries:
        if e.kind != "model" or not e.output_summary:
            continue
        calls.extend(_Call(e, name, args) for name, args in e.calls)
    return calls


def _asks(calls: list[_Call], entry: TraceEntry, name: str) -> bool:
    return any(c.entry is entry and c.name == name for c in calls)


def _last_plan(entries: Sequence[TraceEntry]) -> list[dict[str, Any]]:
    for e in reversed(entries):
        for name, args in reversed(e.calls):
            if name != "update_state":
                continue
            parsed = json_or_text(args)
            if isinstance(parsed, dict) and isinstance(parsed.get("plan"), list):
                return [p for p in parsed["plan"] if isinstance(p, dict)]
    return []


def _short(kind: Any) -> str | None:
    return None if kind is None else str(kind).rsplit(".", 1)[-1]


def _error_text(err: Any) -> str:
    if isinstance(err, dict):
        return f"{_short(err.get('type'))}: {err.get('message', '')}"
    return str(err)
