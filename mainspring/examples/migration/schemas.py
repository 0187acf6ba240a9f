"""What flows between the stages: one pydantic model per stage boundary.

A stage's output is validated when it is produced and again when a replay decodes it
from the journal, so a later stage never reads a shape it does not expect.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = [
    "ImportReceipt",
    "LegacyCustomer",
    "MigrationResult",
    "Reconciliation",
    "Rejection",
    "TargetCustomer",
    "ValidationReport",
]

_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[a-z]{2,}$")
Tier = Literal["enterprise", "business", "starter"]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class LegacyCustomer(_Frozen):
    """A row of the old system, as the export stage reads it (checked by validate)."""

    id: str = Field(pattern=r"^cus_\d{4}$")
    full_name: str = Field(min_length=3)
    email: str
    phone: str
    country: str = Field(pattern=r"^[A-Z]{2}$")
    plan: Literal["free", "pro", "team", "enterprise"]
    seats: int = Field(ge=1)

    @field_validator("email")
    @classmethod
    def _email(cls, value: str) -> str:
        if not _EMAIL.match(value.lower()):
            raise ValueError(f"not an email address: {value!r}")
        return value

    @field_validator("phone")
    @classmethod
    def _phone(cls, value: str) -> str:
        digits = re.sub(r"[^\d]", "", value)
        if not 8 <= len(digits) <= 15:
            raise ValueError(f"a phone number has 8 to 15 digits, got {value!r}")
        return value


class Rejection(_Frozen):
    """A row that validate refused, with why."""

    id: str
    reason: str


class ValidationReport(_Frozen):
    """validate's output: the rows that pass, and the others with their reasons."""

    valid: list[LegacyCustomer]
    rejected: list[Rejection]


class TargetCustomer(_Frozen):
    """A row of the new system, as transform writes it and import sends it."""

    customer_id: str
    first_name: str
    last_name: str
    email: str
    phone: str = Field(pattern=r"^\+\d{8,15}$")
    country: str
    tier: Tier
    segment: str = Field(min_length=1)


class ImportReceipt(_Frozen):
    """What the target said about one write."""

    customer_id: str
    key: str
    applied: bool  # False: the target had seen this idempotency key (a re-run)


class Reconciliation(_Frozen):
    """reconcile's verdict: the target against what transform produced."""

    expected: int
    found: int
    missing: list[str]
    mismatched: list[str]

    @property
    def ok(self) -> bool:
        return not self.missing and not self.mismatched and self.found == self.expected


class MigrationResult(_Frozen):
    """The run's result."""

    exported: int
    rejected: list[Rejection]
    imported: int
    repeats_recognised: int
    tiers: dict[str, int]
    reconciled: bool
