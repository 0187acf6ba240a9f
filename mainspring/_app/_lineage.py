"""Runs made from other runs: :meth:`~mainspring.App.fork` (time travel from a
journal position) and :meth:`~mainspring.App.retry` (a failed run again from its
failing step). A part of :class:`~mainspring.App`, whose :class:`RunHandle` s it hands
out."""

from __future__ import annotations

import getpass
import json
import os
import re
import uuid
from collections.abc import Callable
from typing import Any, Literal

from .._errors import ConfigError, RunConflict
from .._serde import dumps, loads
from .._signals import is_request_signal
from ..observability import fork_traceparent
from ..storage import CHILD_SIGNAL_PREFIX, RunRecord, StepRecord
from ._handle import RunHandle, run_id_of
from ._runtime import Part, Runtime

__all__ = ["NO_EDIT", "Lineage", "local_user", "new_id"]

_NO_EDIT: Any = object()
NO_EDIT = _NO_EDIT  # App.fork's default: no edit


class Lineage(Part):
    """Forks and retries of an App's runs; ``handle`` makes the :class:`RunHandle` of a
    run id (``created``: a new run) for the App."""

    def __init__(self, runtime: Runtime, handle: Callable[[str, bool], RunHandle]) -> None:
        super().__init__(runtime)
        self._handle = handle

    def fork(
        self,
        run_id: str | RunHandle,
        *,
        from_step: int | str,
        edit: Any = _NO_EDIT,
        decisions: Literal["ask", "keep"] = "ask",
        by: str | None = None,
    ) -> RunHandle:
        """Start a new run that replays ``run_id``'s journal up to ``from_step`` and
        executes live from the step after it (time-travel debugging).

        A fork never carries a human decision that nobody made for it. With
        ``decisions="ask"`` (the default) its journal stops before the first request
        to a human (approval, question, budget pause, checkpoint, ``resume``) at or
        before ``from_step``, so the fork asks that request again and runs live from
        there. ``decisions="keep"`` copies the answers, each recorded as decided by
        ``by`` (default: the local user; over HTTP the forking key, which needs the
        ``approve`` scope).

        A fork past the step that started a child run (``ctx.child``) shares that
        child: awaiting it, the fork gets the child's end as the parent does, whether
        the child had ended when the fork was made or ends later.

        Args:
            from_step: the journal position to keep up to, inclusive: ``seq`` in the
                run's current session, or ``"session:seq"`` (session 0 or the current
                one: only their starting hand-offs are known).
            edit: a JSON value merged into that step's journaled output (RFC 7386
                merge patch: an object patches an object, ``null`` removes a key,
                anything else replaces the output), so the new run continues from an
                edited result. A request's step cannot be edited (answer the fork's
                request instead).
            decisions: ``"ask"`` or ``"keep"`` the answers to requests (see above).
            by: who keeps the decisions (with ``decisions="keep"``).

        Raises:
            RunNotFound: no such run.
            ConfigError: no such step, an edit that is not JSON, an edit of a
                request's step, or an edit that ``decisions="ask"`` would drop.
        """
        run_id = run_id_of(run_id)
        if decisions not in ("ask", "keep"):
            raise ConfigError(f"decisions must be 'ask' or 'keep', not {decisions!r}")
        source = self._get_run(run_id)
        session, seq = _position(from_step, source.session)
        steps, target = self._fork_point(run_id, source, session, seq)
        requests = [s for s in steps if s.seq <= seq and _is_request_step(s)]
        if edit is not _NO_EDIT and _is_request_step(target):
            raise ConfigError(
                f"step {session}:{seq} of run {run_id!r} is the request {target.name!r}: a "
                "fork never edits a human's decision; fork from the step before it and "
                "answer the new run's request (with the 'approve' scope)"
            )
        upto, outputs = _carried_decisions(
            run_id, session, seq, requests, decisions=decisions, edited=edit is not _NO_EDIT, by=by
        )
        if edit is not _NO_EDIT:
            patched = _merge_patch(loads(target.output), edit)
            output = dumps(patched, what=f"edited output of step {session}:{seq}")
            if self._redactor is not None:
                output = self._redactor.redact_json(output)
            outputs[seq] = output
        record = self._store.fork_run(
            source,
            run_id=new_id(),
            session=session,
            upto_seq=upto,
            output=None,
            outputs=outputs,
            now=self._clock.now(),
            parent_step=f"{session}:{seq}",
            # in the source's trace: a what-if branch of the run, in the same tree
            traceparent=fork_traceparent(source.id, source.traceparent),
        )
        return self._handle(record.id, True)

    def _fork_point(
        self, run_id: str, source: RunRecord, session: int, seq: int
    ) -> tuple[list[StepRecord], StepRecord]:
        """The journal of the session a fork starts from and its step ``seq``."""
        if session not in (0, source.session):
            raise ConfigError(
                f"cannot fork run {run_id!r} from {session}:{seq}: only session 0 and the "
                f"current session {source.session} can be forked (the hand-off that "
                f"started session {session} is not kept)"
            )
        steps = self._store.load_steps(run_id, session)
        target = next((s for s in steps if s.seq == seq), None)
        if target is None:
            have = f"0..{steps[-1].seq}" if steps else "none"
            raise ConfigError(
                f"run {run_id!r} has no step {session}:{seq} (its session {session} "
                f"journal holds steps {have})"
            )
        return steps, target

    def retry(self, run_id: str | RunHandle) -> RunHandle:
        """Queue a failed run again, from its failing step: the steps it completed
        replay from the journal and are not executed again; the failing step runs
        again with the same idempotency key.

        A completed step is never run again, even where a ``NondeterminismError``
        named it (the journal is right; the code changed): deploy code that matches
        the journal and retry, or :meth:`fork` the run to go another way.

        Raises:
            RunNotFound: no such run.
            RunConflict: the run is not failed.
        """
        run_id = run_id_of(run_id)
        record = self._get_run(run_id)
        if record.status != "failed":
            raise RunConflict(
                f"cannot retry run {run_id!r}: it is {record.status}, and only a failed "
                "run can be retried (fork it to run it again from a step)",
                run_id=run_id,
            )
        from_seq = _failing_seq(record, self._store.load_steps(run_id, record.session))
        self._store.retry_run(run_id, from_seq=from_seq, now=self._clock.now())
        return self._handle(run_id, False)


def local_user() -> str:
    """Who is deciding from this process (recorded as ``by`` with an answer)."""
    try:
        return getpass.getuser()
    except (OSError, KeyError):  # no login name (a container without USER)
        return f"uid:{os.getuid()}" if hasattr(os, "getuid") else "local"


def new_id() -> str:
    """A new run id."""
    return uuid.uuid4().hex


def _carried_decisions(
    run_id: str,
    session: int,
    seq: int,
    requests: list[StepRecord],
    *,
    decisions: Literal["ask", "keep"],
    edited: bool,
    by: str | None,
) -> tuple[int, dict[int, str]]:
    """``(upto, outputs)``: where the fork's copied journal stops, and the answers it
    keeps. Asking again stops before the first request; keeping records each answer
    as decided by ``by``."""
    upto = seq
    outputs: dict[int, str] = {}
    if decisions == "ask" and requests:
        upto = requests[0].seq - 1
        if edited:
            raise ConfigError(
                f"cannot fork run {run_id!r} from {session}:{seq} with an edit: the "
                f"fork asks the request {requests[0].name!r} (step {session}:"
                f"{requests[0].seq}) again and runs live from there, so the edit "
                "would be lost; keep the decisions (decisions='keep', which needs "
                "the 'approve' scope) or fork from before the request"
            )
    elif decisions == "keep":
        who = by if by is not None else local_user()
        for r in requests:
            kept = _kept_decision(r, who, run_id)
            if kept is not None:
                outputs[r.seq] = kept
    return upto, outputs


def _position(step: int | str, current: int) -> tuple[int, int]:
    """``7`` or ``"7"`` (in the current session) or ``"1:7"`` -> ``(session, seq)``."""
    if isinstance(step, bool):
        raise ConfigError(f"a step is a number or 'session:seq', got {step!r}")
    if isinstance(step, int):
        session, seq = current, step
    else:
        m = re.fullmatch(r"\s*(?:(\d+):)?(\d+)\s*", str(step))
        if m is None:
            raise ConfigError(f"a step is a number or 'session:seq', got {step!r}")
        session = int(m.group(1)) if m.group(1) is not None else current
        seq = int(m.group(2))
    if seq < 0:
        raise ConfigError(f"a step number is 0 or more, got {step!r}")
    return session, seq


def _merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return patch
    merged = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = _merge_patch(merged.get(key), value)
    return merged


def _is_request_step(step: StepRecord) -> bool:
    """A wait for a human's answer (whose signal only the answer path may send). A
    wait for a child run's end is none: no one decided it, and a fork holding the
    child's start gets the same end (so it keeps that wait as it is)."""
    if step.kind != "signal" or step.name.startswith(CHILD_SIGNAL_PREFIX):
        return False
    if is_request_signal(step.name):
        return True
    return step.output is not None and step.output.startswith('{"request":')


def _kept_decision(step: StepRecord, by: str, source_run: str) -> str | None:
    """A completed request row's output with its answer recorded as ``by``'s (the
    reviewer who decided in ``source_run`` is kept beside it)."""
    if step.status != "completed" or step.output is None:
        return None
    out = loads(step.output)
    if not isinstance(out, dict) or "signal" not in out:
        return None  # timed out: the wait's default, no reviewer's answer to re-own
    answer = out["signal"]
    if not isinstance(answer, dict):  # an old raw signal's bare value: nowhere to record
        return None
    answer = {**answer, "by": by, "kept_from": {"run_id": source_run, "by": answer.get("by")}}
    return dumps({**out, "signal": answer}, what=f"kept decision of step {step.name!r}")


def _failing_seq(record: RunRecord, steps: list[StepRecord]) -> int | None:
    """The seq of the step that failed the run, in its current session: the one its
    error names, else a failed last row; ``None`` when no step failed it."""
    try:
        error = json.loads(record.error) if record.error else {}
    except ValueError:
        error = {}
    where = error.get("step") if isinstance(error, dict) else None
    if isinstance(where, str):
        m = re.match(r"(\d+):(\d+) ", where)
        if m and int(m.group(1)) == record.session:
            return int(m.group(2))
    if steps and steps[-1].status == "failed":
        return steps[-1].seq
    return None
