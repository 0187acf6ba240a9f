"""A staged data migration: export, validate, transform, import, reconcile.

Seed 000's advice made a workflow: each stage is a journaled step with typed input and
output (pydantic models), rows that break the rules are rejected with a reason, a stage
gate holds the import until a reviewer has seen the counts and a sample, every write
carries the step's idempotency key, and a reconciliation that does not add up undoes
what the import wrote (compensation) before the run fails.

``python -m mainspring.examples.migration`` runs it in-process (SQLite in a temp dir, a FakeClock,
a scripted model); ``mainspring demo`` runs it in real worker processes and kills one.
"""

from .pipeline import MigrationConfig, build
from .schemas import (
    ImportReceipt,
    LegacyCustomer,
    MigrationResult,
    Reconciliation,
    Rejection,
    TargetCustomer,
    ValidationReport,
)
from .target import TargetStore, legacy_rows

__all__ = [
    "ImportReceipt",
    "LegacyCustomer",
    "MigrationConfig",
    "MigrationResult",
    "Reconciliation",
    "Rejection",
    "TargetCustomer",
    "TargetStore",
    "ValidationReport",
    "build",
    "legacy_rows",
]
