"""Fakes that users' tests need too: a clock that moves on command, an effect ledger,
and the Store conformance suite (``mainspring.testing.conformance``)."""

from .._clock import FakeClock
from ._ledger import EffectLedger, LedgerReport

__all__ = ["EffectLedger", "FakeClock", "LedgerReport"]
