"""The migration for ``mainspring worker mainspring.examples.migration.worker_app:app``.

``mainspring demo`` starts workers on it. It reads ``MAINSPRING_DATABASE_URL`` (the
store) and ``MIGRATION_TARGET`` (the target's SQLite file). The target answers with
latency (30 ms before the write, 50 ms after it), every 7th customer's first write
fails (half of them after the target applied it), and the transform stage's model
fails or answers malformed JSON now and then: the faults a real migration meets. The
faults are seeded (the same in every run of the demo) and never more in a row than the
stage's retries absorb: the demo never fails by its own dice.
"""

from __future__ import annotations

import os

import mainspring as ms

from .local import segment_model
from .pipeline import MigrationConfig, build
from .target import TargetStore

TARGET_ENV = "MIGRATION_TARGET"

if not os.environ.get(TARGET_ENV):
    raise ms.ConfigError(f"{__name__} needs {TARGET_ENV} (the target's SQLite file)")

app = ms.App()  # the database: MAINSPRING_DATABASE_URL
target = TargetStore(os.environ[TARGET_ENV])
config = MigrationConfig(
    flaky_every=7,
    request_s=0.03,
    reply_s=0.05,
    retry=ms.RetryPolicy(max_attempts=4, initial_s=0.05, max_s=0.2),
)
migrate_customers = build(app, target, segment_model(), config)
