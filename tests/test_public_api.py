"""The public face: every name users import is here, and nothing else leaks."""

from __future__ import annotations

import mainspring as ms
import mainspring.testing

EXPECTED = {
    "App", "BudgetExceeded", "Cancelled", "Clock", "ConfigError", "ContextOverflow",
    "FakeClock", "LeaseLost", "LoopDetected", "MainspringError", "MissingExtra",
    "ModelOutputError",
    "NondeterminismError", "PermissionDenied", "QuotaExhausted", "RateLimited",
    "RetryPolicy", "RunConflict", "RunContext", "RunFailed", "RunHandle", "RunNotFound",
    "RunWaiting",
    "RunRecord", "SchemaVersionError", "SerializationError", "StepFailed", "StepInfo",
    "StepInterrupted", "StepMode", "StepRecord", "StepTimeout", "Store", "StoreError",
    "StoreUnavailable", "SystemClock", "ToolInputError", "ToolNotAllowed",
    "TransientError", "UnknownTool", "UnknownWorkflow", "ValidationFailed",
    "WaitTimeout", "Worker", "Workflow", "__version__", "current_step",
    "Effect", "Tool", "ToolContext", "tool", "Agent", "AgentResult", "AgentState",
    "ContextPolicy", "Limits", "Redactor", "RunTrace", "TraceEntry",
    "Approval", "ApprovalRejected", "InvalidAnswer", "Request", "RequestNotFound", "ReservedSignal",
    "StepCall", "StepInterceptor", "Overloaded", "call_model",
    "ApiKey", "Delivery", "SCOPES", "Scope", "Webhook", "WebhookEvent",
    "ChildFailed", "ChildCancelled", "ChildHandle",
    "Schedule", "ScheduleNotFound",
    "TokenEvent", "TokenFollower",
    "Queue",
    "ReplayReport", "RunCheck",
    "ArgumentChange", "RecordedRun", "ShadowReport", "ShadowRun", "ShadowSide",
    "ShadowStubMissing", "StubAnswer",
}  # fmt: skip


def test_public_names_are_pinned() -> None:
    assert set(ms.__all__) == EXPECTED
    for name in ms.__all__:
        assert hasattr(ms, name), name


def test_testing_names_are_pinned() -> None:
    assert set(mainspring.testing.__all__) == {
        "EffectLedger", "FakeAnthropicServer", "FakeClock", "FakeOpenAIServer", "FakeReply",
        "FakeToolCall", "FaultProfile", "FaultyModel", "LedgerReport", "RecordedRequest",
        "ScriptedModel", "SimulatedCrash", "Fault", "FaultKind", "FaultyStore", "StoreCall",
        "StoreHistory", "Violation", "assert_invariants", "check_invariants", "commits_with",
    }  # fmt: skip


def test_subpackage_doors_are_pinned() -> None:
    """What the server, the CLI, the dashboard and the lab (and users) read values and
    drive workers with."""
    import mainspring.serde
    import mainspring.worker

    assert set(mainspring.serde.__all__) == {
        "decode", "dumps", "loads", "public_error", "return_type_problem", "revive",
    }  # fmt: skip
    assert set(mainspring.worker.__all__) == {
        "Worker", "WorkerHost", "WorkerStats", "WorkerTelemetry",
    }  # fmt: skip
    assert mainspring.serde.loads(mainspring.serde.dumps({"a": (1, 2)})) == {"a": [1, 2]}
    assert mainspring.serde.public_error({"type": "E", "traceback": "..."}) == {"type": "E"}


def test_every_error_says_whether_a_retry_helps() -> None:
    errors = [getattr(ms, n) for n in ms.__all__ if isinstance(getattr(ms, n), type)]
    errors = [e for e in errors if issubclass(e, ms.MainspringError)]
    assert len(errors) >= 20
    retryable = {e.__name__ for e in errors if e.retryable}
    assert retryable == {
        "TransientError",
        "RateLimited",
        "Overloaded",
        "StepTimeout",
        "StoreUnavailable",
    }
    assert not issubclass(ms.Cancelled, Exception)  # user code cannot swallow it


def test_errors_name_the_run_and_step() -> None:
    err = ms.StepFailed("boom", error_type="x.Y", attempts=2, run_id="r1", step="0:3 'pay'")
    assert str(err) == "boom (run r1, step 0:3 'pay')"
