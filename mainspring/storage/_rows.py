"""The columns of runs and journal rows, and their records: shared by the parts
that read or copy them."""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from operator import attrgetter
from typing import Any

from ._records import RunRecord, SignalRecord, StepRecord

_RUN_COLUMNS = (
    "id, workflow, idem_key, status, input, output, error, session, handoff, epoch, owner,"
    " lease_until, wake_at, wait_reason, recoveries, cancel_requested, created_at, updated_at,"
    " finished_at, traceparent, parent, parent_step, parent_kind, version, schedule,"
    " queue, queue_key, priority, parent_close, retries"
)
# The same, without the large values (input, output, hand-off): what lists need.
_RUN_SUMMARY_COLUMNS = _RUN_COLUMNS.replace("input, output,", "NULL, NULL,").replace(
    " handoff,", " NULL,"
)
_STEP_COLUMNS = (
    "run_id, session, seq, kind, name, status, attempt, epoch, output, error, started_at,"
    " finished_at, wake_at, role"
)
# A journal row only moves forward: to a later attempt, or within an attempt from
# started to retrying to an end; a completed or failed row is final. So a write
# re-sent late (a retried flush, a commit that was ambiguous) never replaces a
# newer row with its older snapshot.
_STEP_RANK = "CASE {t}.status WHEN 'started' THEN 0 WHEN 'retrying' THEN 1 ELSE 2 END"
_UPSERT_STEP = (
    f"INSERT INTO ms_steps ({_STEP_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)"
    " ON CONFLICT (run_id, session, seq) DO UPDATE SET kind = excluded.kind,"
    " name = excluded.name, status = excluded.status, attempt = excluded.attempt,"
    " epoch = excluded.epoch, output = excluded.output, error = excluded.error,"
    " started_at = excluded.started_at, finished_at = excluded.finished_at,"
    " wake_at = excluded.wake_at, role = excluded.role"
    " WHERE ms_steps.status NOT IN ('completed', 'failed')"
    " AND (excluded.attempt > ms_steps.attempt OR (excluded.attempt = ms_steps.attempt"
    f" AND {_STEP_RANK.format(t='excluded')} >= {_STEP_RANK.format(t='ms_steps')}))"
)
_SIGNAL_COLUMNS = "id, run_id, name, payload, created_at, consumed_at, consumed_by"


def _given(**columns: Any) -> tuple[list[str], list[Any]]:
    """``column = ?`` and its value for each of ``columns`` whose value is not
    ``None``, in order: the filters a listing applies only when it is asked to (more
    conditions may be added to both lists)."""
    given = {c: v for c, v in columns.items() if v is not None}
    return [f"{c} = ?" for c in given], list(given.values())


def _versions_sql(versions: Sequence[str | None]) -> tuple[str, list[Any]]:
    """A condition on ``ms_runs.version``: one of ``versions`` (``None`` in it: a run
    submitted with no version); nothing matches an empty list."""
    named = [v for v in versions if v is not None]
    parts = [f"version IN ({', '.join('?' * len(named))})"] if named else []
    if None in versions:
        parts.append("version IS NULL")
    return ("(" + " OR ".join(parts) + ")" if parts else "1 = 0"), named


def _claimable_sql(
    workflows: Sequence[str] | None,
    versions: Sequence[str | None] | None,
    skip: Collection[str] = (),
) -> tuple[str, list[Any]]:
    """Conditions (`` AND ...``) and their parameters on the runs a worker may claim:
    of these workflows (``None`` or empty: any), of these code versions (as
    :func:`_versions_sql`; ``None``: any), and not in ``skip``. One spelling for the
    claim and for the questions a worker asks about what it could claim next."""
    sql = f" AND workflow IN ({', '.join('?' * len(workflows))})" if workflows else ""
    params: list[Any] = list(workflows or [])
    if versions is not None:
        v_sql, v_params = _versions_sql(versions)
        sql += f" AND {v_sql}"
        params += v_params
    if skip:
        avoided = sorted(skip)
        sql += f" AND id NOT IN ({', '.join('?' * len(avoided))})"
        params += avoided
    return sql, params


def _names(columns: str, **renamed: str) -> tuple[str, ...]:
    """The names in ``columns`` (an SQL list), in order, each as ``renamed`` maps it:
    the fields of the record a row of them fills. One list thus says both what a
    ``SELECT`` reads and where each value goes, so the two cannot drift apart."""
    names = (c.strip() for c in columns.split(","))
    return tuple(renamed.get(c, c) for c in names)


_RUN_FIELDS = _names(_RUN_COLUMNS, idem_key="key")
_STEP_FIELDS = _names(_STEP_COLUMNS)
_SIGNAL_FIELDS = _names(_SIGNAL_COLUMNS)


def _run(row: Sequence[Any]) -> RunRecord:
    # zip: a caller may select more columns after the run's (``wait_signal``).
    run = dict(zip(_RUN_FIELDS, row, strict=False))
    run["cancel_requested"] = bool(run["cancel_requested"])  # 0 or 1 in the table
    return RunRecord(**run)


def _step(row: Sequence[Any]) -> StepRecord:
    # Spelled out, not built from _STEP_FIELDS like the other records: a replay reads
    # every row of the journal through here, and keywords by index take half the time
    # of a dict made by zip (1.2 against 2.9 µs a row; tests/test_store_parts.py
    # checks the two lists agree).
    return StepRecord(
        run_id=row[0], session=row[1], seq=row[2], kind=row[3], name=row[4],
        status=row[5], attempt=row[6], epoch=row[7], output=row[8], error=row[9],
        started_at=row[10], finished_at=row[11], wake_at=row[12], role=row[13],
    )  # fmt: skip


# A journal row's values in the order of _STEP_COLUMNS: an upsert's parameters.
_step_params: Callable[[StepRecord], tuple[Any, ...]] = attrgetter(*_STEP_FIELDS)


def _signal(row: Sequence[Any]) -> SignalRecord:
    return SignalRecord(**dict(zip(_SIGNAL_FIELDS, row, strict=True)))
