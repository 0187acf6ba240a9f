"""Fakes that users' tests need too: a clock that moves on command, an effect ledger,
deterministic and faulty models, fake OpenAI and Anthropic servers that speak the real
wire protocols on 127.0.0.1, a fault-injecting store wrapper, the engine's invariants
written once, and the Store conformance suite (``mainspring.testing.conformance``)."""

from .._clock import FakeClock
from .._home import publish
from ..journal import SimulatedCrash
from ..models.faulty import FaultProfile, FaultyModel
from ..models.scripted import ScriptedModel
from ._fake_anthropic import FakeAnthropicServer
from ._fake_common import FakeReply, FakeToolCall, RecordedRequest
from ._fake_openai import FakeOpenAIServer
from ._faults import Fault, FaultKind, FaultyStore, StoreCall, commits_with
from ._invariants import StoreHistory, Violation, assert_invariants, check_invariants
from ._ledger import EffectLedger, LedgerReport

__all__ = [
    "EffectLedger",
    "FakeAnthropicServer",
    "FakeClock",
    "FakeOpenAIServer",
    "FakeReply",
    "FakeToolCall",
    "Fault",
    "FaultKind",
    "FaultProfile",
    "FaultyModel",
    "FaultyStore",
    "LedgerReport",
    "RecordedRequest",
    "ScriptedModel",
    "SimulatedCrash",
    "StoreCall",
    "StoreHistory",
    "Violation",
    "assert_invariants",
    "check_invariants",
    "commits_with",
]

publish(__name__, __all__)  # users see mainspring.testing.FaultyStore (see _home.py)
