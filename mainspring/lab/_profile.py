"""``LabProfile``: the faults the lab injects, and the policies it compares."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Final, Literal, TypeAlias

from .. import ConfigError

__all__ = ["POLICIES", "POLICY_TITLES", "FailureCause", "LabProfile", "Policy", "parse_policies"]

Policy: TypeAlias = Literal["naive", "retries", "checkpoint", "validate", "mainspring"]
POLICIES: Final[tuple[Policy, ...]] = ("naive", "retries", "checkpoint", "validate", "mainspring")
POLICY_TITLES: Final[dict[Policy, str]] = {
    "naive": "naive loop (stop at the first error)",
    "retries": "step retries",
    "checkpoint": "retries + checkpoint and resume (journal)",
    "validate": "+ validators and repair",
    "mainspring": "full mainspring (+ idempotency keys)",
}

FailureCause: TypeAlias = Literal[
    "model_error",
    "tool_failure",
    "timeout",
    "malformed",
    "worker_crash",
    "correlated",
    "dead_letter",
    # `mainspring lab run` (a user's workflow): an injected error in a non-model step, a
    # failure the lab did not inject, a wait for a human or signal the lab cannot give,
    # an agent that stopped partial, a result the `check` rejected
    "step_error",
    "workflow_error",
    "stalled",
    "partial",
    "wrong_result",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class LabProfile:
    """The faults of one lab experiment (probabilities per step attempt unless noted).

    Attributes:
        model_error_rate: the model call fails (a 5xx, a dropped connection).
        tool_failure_rate: the tool call fails; half the time *after* its effect took
            place (the response was lost), so a blind retry repeats the effect.
        timeout_rate: the model call hangs until its timeout.
        malformed_rate: the model answers, but with output that breaks the step's
            schema; unnoticed without validators, it spoils the final result.
        crash_rate: the worker process dies during the step (before or after the
            effect), per step attempt.
        correlated_rate: per task and step, the step is broken for that task: every
            attempt of every trial fails the same way (retries cannot fix it).
        retries: retries per step for the policies that retry.
        timeout_s: simulated seconds a hung call costs before it times out.
        lease_s: simulated seconds before a crashed run's lease expires.
        input_tokens / output_tokens: tokens of one model call.
        price_in / price_out: USD per million tokens (gpt-4.1-mini's by default).
    """

    model_error_rate: float = 0.0
    tool_failure_rate: float = 0.0
    timeout_rate: float = 0.0
    malformed_rate: float = 0.0
    crash_rate: float = 0.0
    correlated_rate: float = 0.0
    retries: int = 2
    timeout_s: float = 30.0
    lease_s: float = 15.0
    input_tokens: int = 600
    output_tokens: int = 120
    price_in: float = 0.40
    price_out: float = 1.60

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name.endswith("_rate") and not 0.0 <= value <= 1.0:
                raise ConfigError(f"LabProfile.{f.name} must be within [0, 1], got {value!r}")
        if self.model_error_rate + self.timeout_rate + self.malformed_rate > 1.0 + 1e-9:
            raise ConfigError(
                "LabProfile: model_error_rate + timeout_rate + malformed_rate must be at "
                f"most 1, got {self.model_error_rate + self.timeout_rate + self.malformed_rate!r}"
            )
        if self.retries < 0:
            raise ConfigError(f"LabProfile.retries must be >= 0, got {self.retries!r}")
        for name in ("timeout_s", "lease_s", "price_in", "price_out"):
            if getattr(self, name) < 0:
                raise ConfigError(f"LabProfile.{name} must not be negative")

    @property
    def step_error_rate(self) -> float:
        """The chance that one attempt of a step fails for an independent reason
        (what the theory curves use)."""
        ok = (
            (1 - self.model_error_rate - self.timeout_rate - self.malformed_rate)
            * (1 - self.tool_failure_rate)
            * (1 - self.crash_rate)
        )
        return 1.0 - ok

    def call_cost(self) -> float:
        return (self.input_tokens * self.price_in + self.output_tokens * self.price_out) / 1_000_000


def parse_policies(text: str) -> list[Policy]:
    """``"naive,retries"`` or ``"all"``; a clear error names an unknown policy."""
    if text.strip() == "all":
        return list(POLICIES)
    chosen: list[Policy] = []
    for part in (p.strip() for p in text.split(",")):
        if part not in POLICIES:
            raise ConfigError(
                f"unknown policy {part!r}: choose from {', '.join(POLICIES)} (or 'all')"
            )
        if part not in chosen:
            chosen.append(part)
    return chosen
