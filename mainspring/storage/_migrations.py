"""Numbered schema migrations. Never edit a released one: add the next number.

Each migration is SQL shared by every dialect, with a few ``{tokens}`` that a
dialect fills in (an auto-increment key, SQLite's ``WITHOUT ROWID``).
"""

from __future__ import annotations

__all__ = ["LATEST", "MIGRATIONS"]

MIGRATIONS: dict[int, str] = {
    1: """
CREATE TABLE ms_runs (
    id TEXT PRIMARY KEY,
    workflow TEXT NOT NULL,
    idem_key TEXT UNIQUE,
    status TEXT NOT NULL,
    input TEXT NOT NULL,
    output TEXT,
    error TEXT,
    session INTEGER NOT NULL DEFAULT 0,
    handoff TEXT,
    epoch INTEGER NOT NULL DEFAULT 0,
    owner TEXT,
    lease_until {float},
    wake_at {float},
    wait_reason TEXT,
    wait_signal TEXT,
    recoveries INTEGER NOT NULL DEFAULT 0,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    created_at {float} NOT NULL,
    updated_at {float} NOT NULL,
    finished_at {float}
);
CREATE INDEX ms_runs_queued ON ms_runs (created_at) WHERE status = 'queued';
CREATE INDEX ms_runs_wake ON ms_runs (wake_at) WHERE status IN ('sleeping', 'waiting');
CREATE INDEX ms_runs_lease ON ms_runs (lease_until) WHERE status = 'running';
CREATE INDEX ms_runs_created ON ms_runs (created_at);
CREATE TABLE ms_steps (
    run_id TEXT NOT NULL,
    session INTEGER NOT NULL,
    seq INTEGER NOT NULL,
    kind TEXT NOT NULL,
    name TEXT NOT NULL,
    status TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    epoch INTEGER NOT NULL,
    output TEXT,
    error TEXT,
    started_at {float} NOT NULL,
    finished_at {float},
    wake_at {float},
    PRIMARY KEY (run_id, session, seq)
){without_rowid};
CREATE TABLE ms_signals (
    id {autoid},
    run_id TEXT NOT NULL,
    name TEXT NOT NULL,
    payload TEXT NOT NULL,
    created_at {float} NOT NULL,
    consumed_at {float},
    consumed_by TEXT
);
CREATE INDEX ms_signals_pending ON ms_signals (run_id, name, id) WHERE consumed_at IS NULL;
""",
    # Retention: prune finds old finished runs and deletes their signals by run.
    2: """
CREATE INDEX ms_runs_finished ON ms_runs (finished_at) WHERE finished_at IS NOT NULL;
CREATE INDEX ms_signals_run ON ms_signals (run_id);
""",
    # The HTTP API and humans in the loop: API keys (hashed), webhook endpoints and
    # a durable outbox that a commit fills in the same transaction as the transition.
    3: """
CREATE TABLE ms_api_keys (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    hash TEXT NOT NULL,
    scopes TEXT NOT NULL,
    created_at {float} NOT NULL,
    last_used_at {float},
    revoked_at {float}
);
CREATE TABLE ms_webhooks (
    id TEXT PRIMARY KEY,
    url TEXT NOT NULL,
    secret TEXT NOT NULL,
    events TEXT NOT NULL,
    created_at {float} NOT NULL,
    removed_at {float}
);
CREATE TABLE ms_outbox (
    id {autoid},
    event_id TEXT NOT NULL,
    webhook_id TEXT NOT NULL,
    run_id TEXT NOT NULL,
    workflow TEXT NOT NULL,
    event TEXT NOT NULL,
    payload TEXT NOT NULL,
    created_at {float} NOT NULL,
    next_at {float},
    attempts INTEGER NOT NULL DEFAULT 0,
    delivered_at {float},
    last_error TEXT
);
CREATE INDEX ms_outbox_due ON ms_outbox (next_at) WHERE delivered_at IS NULL;
CREATE UNIQUE INDEX ms_outbox_event ON ms_outbox (event_id, webhook_id);
CREATE INDEX ms_outbox_run ON ms_outbox (run_id);
CREATE INDEX ms_runs_updated ON ms_runs (updated_at);
""",
    # Rate limits shared by every worker: one row per (provider, model, account) with
    # the GCRA's theoretical arrival time per dimension, the limits learned from the
    # provider's headers, and the recent output sizes that output reservations use.
    4: """
CREATE TABLE ms_rate_limits (
    key TEXT PRIMARY KEY,
    lim_rpm {float},
    lim_tpm {float},
    lim_itpm {float},
    lim_otpm {float},
    tat_rpm {float} NOT NULL DEFAULT 0,
    tat_tpm {float} NOT NULL DEFAULT 0,
    tat_itpm {float} NOT NULL DEFAULT 0,
    tat_otpm {float} NOT NULL DEFAULT 0,
    blocked_until {float} NOT NULL DEFAULT 0,
    input_ratio {float} NOT NULL DEFAULT 1,
    last_start {float},
    bookings INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE ms_rate_outputs (
    id {autoid},
    key TEXT NOT NULL,
    tokens INTEGER NOT NULL
);
CREATE INDEX ms_rate_outputs_key ON ms_rate_outputs (key, id);
""",
    # The barriers that keep refunds from giving back lapsed capacity (limits/_rate.py):
    # per dimension, [booking number, term] pairs, as JSON.
    5: """
ALTER TABLE ms_rate_limits ADD COLUMN barriers TEXT;
""",
    # Cold start (limits/_rate.py): whether a reply taught the limiter the provider's
    # limits yet, and the one probe request admitted until then (its booking number,
    # when its hold lapses, its run); and the bookings not yet settled, with their
    # runs, as JSON, so that those of a run that ended are given back; and what other
    # clients of the account are seen to use (JSON).
    6: """
ALTER TABLE ms_rate_limits ADD COLUMN holds TEXT;
ALTER TABLE ms_rate_limits ADD COLUMN outside TEXT;
ALTER TABLE ms_rate_limits ADD COLUMN contacted INTEGER NOT NULL DEFAULT 0;
ALTER TABLE ms_rate_limits ADD COLUMN probe_seq INTEGER NOT NULL DEFAULT 0;
ALTER TABLE ms_rate_limits ADD COLUMN probe_until {float} NOT NULL DEFAULT 0;
ALTER TABLE ms_rate_limits ADD COLUMN probe_run TEXT;
""",
    # The W3C traceparent a run was submitted with (POST /runs): its spans join the
    # caller's trace. NULL: the run is a trace of its own.
    7: """
ALTER TABLE ms_runs ADD COLUMN traceparent TEXT;
""",
    # Fork lineage: the run a fork was made from and the step ("session:seq").
    8: """
ALTER TABLE ms_runs ADD COLUMN parent TEXT;
ALTER TABLE ms_runs ADD COLUMN parent_step TEXT;
""",
    # Step roles are data: what a ``ctx.step`` row is (a model call, a tool call, rate
    # bookkeeping, a rate-limit wait, or any other step), declared by its writer
    # (``ctx.step(..., role=...)``). Older rows spelled it in their name's prefix:
    # ``model:``, ``tool:``, ``rate:wait:`` (a wait), ``rate:`` and ``rate-refund:``
    # (bookkeeping). substr, not LIKE: LIKE ignores case on SQLite and reads "_". Only
    # rows with such a prefix are rewritten: the others keep the default.
    9: """
ALTER TABLE ms_steps ADD COLUMN role TEXT NOT NULL DEFAULT 'step';
UPDATE ms_steps SET role = CASE
    WHEN substr(name, 1, 6) = 'model:' THEN 'model'
    WHEN substr(name, 1, 5) = 'tool:' THEN 'tool'
    WHEN substr(name, 1, 10) = 'rate:wait:' THEN 'wait'
    WHEN substr(name, 1, 5) = 'rate:' THEN 'rate'
    WHEN substr(name, 1, 12) = 'rate-refund:' THEN 'rate'
    ELSE 'step' END
WHERE kind = 'step' AND (substr(name, 1, 6) = 'model:' OR substr(name, 1, 5) IN ('tool:', 'rate:')
    OR substr(name, 1, 12) = 'rate-refund:');
""",
    # Composition and versioning: what a run's ``parent`` is to it (``fork``: it was
    # forked from that run; ``child``: that run started it as a step), and the code
    # version of the application that submitted it (``App(version=...)``; NULL: none
    # declared). Earlier parents were all forks.
    10: """
ALTER TABLE ms_runs ADD COLUMN parent_kind TEXT;
ALTER TABLE ms_runs ADD COLUMN version TEXT;
UPDATE ms_runs SET parent_kind = 'fork' WHERE parent IS NOT NULL;
CREATE INDEX ms_runs_parent ON ms_runs (parent) WHERE parent IS NOT NULL;
""",
    # Schedules (storage/_schedules.py): one row per schedule, its definition (a cron
    # expression read in a time zone, the workflow and its encoded input, the catch-up
    # policy), when it is next due, whether it is paused, and the last run it started.
    # Workers move next_at on with a conditional UPDATE, so one of them fires each time.
    # A run a schedule started names it (ms_runs.schedule; its key names the due time).
    11: """
ALTER TABLE ms_runs ADD COLUMN schedule TEXT;
CREATE TABLE ms_schedules (
    name TEXT PRIMARY KEY,
    cron TEXT NOT NULL,
    tz TEXT NOT NULL,
    workflow TEXT NOT NULL,
    input TEXT NOT NULL,
    catch_up TEXT NOT NULL,
    next_at {float} NOT NULL,
    paused INTEGER NOT NULL DEFAULT 0,
    last_at {float},
    last_run TEXT,
    created_at {float} NOT NULL,
    updated_at {float} NOT NULL
);
CREATE INDEX ms_schedules_due ON ms_schedules (next_at) WHERE paused = 0;
""",
    # Queues (docs/schedules-and-queues.md): a run's queue, its key within the queue
    # (per-key limits: one run at a time per customer) and its priority (higher
    # first); the declared limits of each queue and the theoretical arrival time of
    # its rate of starts (GCRA), advanced in the claim's transaction. Queue-less
    # claims read their own partial index, so a backlog in queues never slows them.
    12: """
ALTER TABLE ms_runs ADD COLUMN queue TEXT;
ALTER TABLE ms_runs ADD COLUMN queue_key TEXT;
ALTER TABLE ms_runs ADD COLUMN priority INTEGER NOT NULL DEFAULT 0;
CREATE TABLE ms_queues (
    name TEXT PRIMARY KEY,
    concurrency INTEGER,
    per_key INTEGER,
    rate {float},
    burst INTEGER NOT NULL DEFAULT 1,
    tat {float} NOT NULL DEFAULT 0,
    updated_at {float} NOT NULL
);
DROP INDEX ms_runs_queued;
CREATE INDEX ms_runs_queued ON ms_runs (created_at) WHERE status = 'queued' AND queue IS NULL;
CREATE INDEX ms_runs_queue_fresh ON ms_runs (queue, priority DESC, created_at)
    WHERE status = 'queued' AND queue IS NOT NULL;
CREATE INDEX ms_runs_queue_wake ON ms_runs (queue, wake_at)
    WHERE status IN ('sleeping', 'waiting') AND queue IS NOT NULL;
CREATE INDEX ms_runs_queue_running ON ms_runs (queue, queue_key)
    WHERE status = 'running' AND queue IS NOT NULL;
""",
    # Live token streams (storage/_streams.py): a model step's output deltas while the
    # call is in flight, batched (never one row per token), per attempt. Ephemeral:
    # not the journal (which keeps the final reply); pruned by age and with their run.
    13: """
CREATE TABLE ms_stream_chunks (
    id {autoid},
    run_id TEXT NOT NULL,
    session INTEGER NOT NULL,
    seq INTEGER NOT NULL,
    attempt INTEGER NOT NULL,
    idx INTEGER NOT NULL,
    text TEXT NOT NULL,
    end_reason TEXT,
    created_at {float} NOT NULL
);
CREATE INDEX ms_stream_chunks_run ON ms_stream_chunks (run_id, id);
CREATE INDEX ms_stream_chunks_created ON ms_stream_chunks (created_at);
""",
    # Parent-close policy (docs/composition.md): what a child run's parent's end does
    # to it, ``cancel`` (the default) or ``abandon`` (``on_parent_close=``). NULL: a
    # child started before this column, which keeps what it was started under (a
    # cancel of its parent cascades to it; its parent's normal end leaves it running).
    14: """
ALTER TABLE ms_runs ADD COLUMN parent_close TEXT;
""",
    # Dashboard sessions (storage/_api.py): a login's opaque token, stored as its
    # SHA-256 only, with the key it stands for and when it ends. In the database, not
    # in a serving process, so a session survives a restart of ``serve`` and works on
    # every ``serve`` behind a load balancer; logout deletes the row.
    15: """
CREATE TABLE ms_sessions (
    hash TEXT PRIMARY KEY,
    key_id TEXT NOT NULL,
    created_at {float} NOT NULL,
    expires_at {float} NOT NULL
);
CREATE INDEX ms_sessions_key ON ms_sessions (key_id, created_at);
CREATE INDEX ms_sessions_expires ON ms_sessions (expires_at);
""",
    # Token streams held to the journal's bar (docs/streaming.md, storage/_streams.py):
    # every row carries the epoch of the execution that wrote it (an append is fenced
    # by it), and ``pos``, the row's place in its run's streams in commit order,
    # handed out under the lock of the run's ``ms_stream_heads`` row, so that a
    # reader paging by ``pos`` can never step over a row that commits late (on
    # PostgreSQL an ``id`` is taken at INSERT and seen at COMMIT). Older rows keep
    # their id as their place, so a reader's cursor from before stays valid. Rows may
    # also carry a tool call's arguments as they form (``kind = 'tool_call'``).
    16: """
CREATE TABLE ms_stream_heads (
    run_id TEXT PRIMARY KEY,
    pos BIGINT NOT NULL
){without_rowid};
INSERT INTO ms_stream_heads (run_id, pos)
    SELECT run_id, MAX(id) FROM ms_stream_chunks GROUP BY run_id;
ALTER TABLE ms_stream_chunks ADD COLUMN pos BIGINT;
UPDATE ms_stream_chunks SET pos = id;
ALTER TABLE ms_stream_chunks ADD COLUMN epoch INTEGER NOT NULL DEFAULT 0;
ALTER TABLE ms_stream_chunks ADD COLUMN kind TEXT NOT NULL DEFAULT 'text';
ALTER TABLE ms_stream_chunks ADD COLUMN call_index INTEGER;
ALTER TABLE ms_stream_chunks ADD COLUMN call_id TEXT;
ALTER TABLE ms_stream_chunks ADD COLUMN name TEXT;
DROP INDEX ms_stream_chunks_run;
CREATE UNIQUE INDEX ms_stream_chunks_pos ON ms_stream_chunks (run_id, pos);
""",
    # A schedule's queue (docs/schedules-and-queues.md): the queue its runs start in,
    # within that queue's limits; NULL: none, as every schedule stored before.
    17: """
ALTER TABLE ms_schedules ADD COLUMN queue TEXT;
""",
    # A run sleeping on a retry back-off keeps its queue slot (storage/_queues.py):
    # its suspend sets keeps_slot; the claim counts such runs as holding a slot and
    # starts them again, once due, without needing room.
    18: """
ALTER TABLE ms_runs ADD COLUMN keeps_slot INTEGER NOT NULL DEFAULT 0;
CREATE INDEX ms_runs_queue_held ON ms_runs (queue, queue_key)
    WHERE status = 'sleeping' AND keeps_slot = 1 AND queue IS NOT NULL;
""",
    # Checkpoints that integrations keep over this database (storage/_checkpoints.py):
    # a LangGraph graph's checkpoints, channel values (a value once per version) and
    # pending writes, by thread (for a graph run on
    # mainspring, the thread is the run's id). ``position`` numbers the checkpoints one
    # execution of a run mirrors, so that a replay finds those it mirrored before.
    19: """
CREATE TABLE ms_checkpoints (
    thread_id TEXT NOT NULL,
    checkpoint_ns TEXT NOT NULL,
    checkpoint_id TEXT NOT NULL,
    parent_id TEXT,
    position INTEGER,
    checkpoint TEXT NOT NULL,
    metadata TEXT NOT NULL,
    created_at {float} NOT NULL,
    PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id)
){without_rowid};
CREATE TABLE ms_checkpoint_writes (
    thread_id TEXT NOT NULL,
    checkpoint_ns TEXT NOT NULL,
    checkpoint_id TEXT NOT NULL,
    task_id TEXT NOT NULL,
    idx INTEGER NOT NULL,
    channel TEXT NOT NULL,
    value TEXT NOT NULL,
    task_path TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id, task_id, idx)
){without_rowid};
CREATE TABLE ms_checkpoint_blobs (
    thread_id TEXT NOT NULL,
    checkpoint_ns TEXT NOT NULL,
    channel TEXT NOT NULL,
    version TEXT NOT NULL,
    value TEXT NOT NULL,
    PRIMARY KEY (thread_id, checkpoint_ns, channel, version)
){without_rowid};
""",
    # The worker registry (storage/_workers.py, the dashboard's workers page): a row per
    # worker process, written by its heartbeat (in the heartbeat's own transaction),
    # marked stopped on a graceful stop, forgotten a while after it went silent.
    # ``lease_s``: how long it may stay silent before it counts as dead. And a run's
    # ``retries``: how many times a person retried it after it failed (its marker in
    # the runs list).
    20: """
ALTER TABLE ms_runs ADD COLUMN retries INTEGER NOT NULL DEFAULT 0;
CREATE TABLE ms_workers (
    id TEXT PRIMARY KEY,
    host TEXT NOT NULL,
    pid INTEGER NOT NULL,
    started_at {float} NOT NULL,
    beat_at {float} NOT NULL,
    lease_s {float} NOT NULL,
    stopped_at {float}
){without_rowid};
""",
}

LATEST = max(MIGRATIONS)
