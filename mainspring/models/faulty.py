"""``FaultyModel``: wraps any model and injects seeded faults, for tests and the lab.

Which fault (if any) hits a call depends only on the seed and the call's index, so a
run under faults is reproducible::

    model = FaultyModel(inner, FaultProfile(transient_rate=0.1, malformed_rate=0.05), seed=7)

A fault replaces the call: the inner model is not asked, so a scripted inner model keeps
its place and the retry (or the repair request) gets the turn the fault displaced.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Literal, TypeAlias

from .._clock import Clock
from .._errors import ConfigError, RateLimited, TransientError
from ._base import Model
from ._common import estimate_input_tokens, estimate_tokens
from ._types import Message, ModelResponse, ModelSettings, ToolCall, ToolSpec, Usage

__all__ = ["FAULT_KINDS", "FaultKind", "FaultProfile", "FaultyModel"]

FaultKind: TypeAlias = Literal[
    "transient", "rate_limit", "malformed", "timeout", "refusal", "empty"
]
FAULT_KINDS: tuple[FaultKind, ...] = (
    "transient",
    "rate_limit",
    "malformed",
    "timeout",
    "refusal",
    "empty",
)

# Malformed tool calls: broken JSON, JSON that is not an object, a call with no name.
_MALFORMED_ARGUMENTS = ('{"value": ', "[1, 2, 3]", "{}")


@dataclass(frozen=True, slots=True, kw_only=True)
class FaultProfile:
    """How often each fault hits a call (probabilities; their sum is at most 1).

    Attributes:
        transient_rate: the call raises :class:`TransientError` (a 5xx, a dropped
            connection).
        rate_limit_rate: the call raises :class:`RateLimited` with ``retry_after_s``.
        malformed_rate: the reply's tool call is malformed: broken JSON arguments,
            arguments that are not an object, or a call with no tool name (text-only
            requests get truncated JSON text).
        timeout_rate: the call hangs ``timeout_s`` seconds, then raises
            :class:`TransientError` as a client timeout does.
        refusal_rate: the reply is a refusal (``finish_reason="refusal"``).
        empty_rate: the reply has neither text nor tool calls.
        timeout_s: how long a hang lasts.
        retry_after_s: the ``retry_after`` of an injected rate limit.
        max_in_a_row: at most this many calls in a row meet a fault; the next one
            passes (``None``: no bound). With a retry policy of more attempts than
            this, every call recovers: a demo or a test that must not fail by its own
            dice sets it.
    """

    transient_rate: float = 0.0
    rate_limit_rate: float = 0.0
    malformed_rate: float = 0.0
    timeout_rate: float = 0.0
    refusal_rate: float = 0.0
    empty_rate: float = 0.0
    timeout_s: float = 1.0
    retry_after_s: float = 1.0
    max_in_a_row: int | None = None

    def __post_init__(self) -> None:
        if self.max_in_a_row is not None and (
            isinstance(self.max_in_a_row, bool)
            or not isinstance(self.max_in_a_row, int)
            or self.max_in_a_row < 0
        ):
            raise ConfigError(
                f"FaultProfile.max_in_a_row must be an int >= 0 or None, got {self.max_in_a_row!r}"
            )
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name.endswith("_rate") and not 0.0 <= value <= 1.0:
                raise ConfigError(f"FaultProfile.{f.name} must be within [0, 1], got {value!r}")
            if f.name.endswith("_s") and value < 0:
                raise ConfigError(f"FaultProfile.{f.name} must not be negative, got {value!r}")
        if self.total_rate > 1.0 + 1e-9:
            raise ConfigError(f"FaultProfile rates add up to {self.total_rate!r}, more than 1")

    @classmethod
    def uniform(
        cls, rate: float, *, timeout_s: float = 1.0, retry_after_s: float = 1.0
    ) -> FaultProfile:
        """A profile where each call fails with probability ``rate``, the kind of fault
        drawn evenly from the six."""
        each = rate / len(FAULT_KINDS)
        return cls(
            transient_rate=each,
            rate_limit_rate=each,
            malformed_rate=each,
            timeout_rate=each,
            refusal_rate=each,
            empty_rate=each,
            timeout_s=timeout_s,
            retry_after_s=retry_after_s,
        )

    @property
    def total_rate(self) -> float:
        """The probability that a call meets any fault."""
        return sum(self.rates().values())

    def rates(self) -> dict[FaultKind, float]:
        """Each fault kind's probability."""
        return {
            "transient": self.transient_rate,
            "rate_limit": self.rate_limit_rate,
            "malformed": self.malformed_rate,
            "timeout": self.timeout_rate,
            "refusal": self.refusal_rate,
            "empty": self.empty_rate,
        }


class FaultyModel(Model):
    """Wraps ``inner`` and injects faults by ``profile``, reproducibly per ``seed``.

    Args:
        inner: the model that answers when no fault hits.
        profile: how often each fault hits.
        seed: the seed; call ``i`` meets the fault :meth:`fault_at` ``(i)`` returns.
        clock: what a hang sleeps on (a ``FakeClock`` lets a test skip it); the real
            clock by default.

    Attributes:
        calls: requests received so far.
        injected: how many faults of each kind were injected.
        history: the fault of each call in order (``None``: passed to ``inner``).

    It stands in for ``inner``: ``name``, ``provider`` and ``model_id`` are the inner
    model's, so rate limits and prices apply as they would.
    """

    def __init__(
        self,
        inner: Model,
        profile: FaultProfile,
        seed: int = 0,
        *,
        clock: Clock | None = None,
    ) -> None:
        self.inner = inner
        self.profile = profile
        self.seed = seed
        self.name = inner.name
        self.provider = inner.provider
        self.remote = inner.remote
        self.model_id = inner.model_id
        self._clock = clock
        self.calls = 0
        self.injected: Counter[FaultKind] = Counter()
        self.history: list[FaultKind | None] = []
        self._in_a_row = 0  # faults on the calls just before this one

    def __repr__(self) -> str:
        return f"<FaultyModel {self.name!r} seed={self.seed} {self.profile!r}>"

    def _rng(self, index: int) -> random.Random:
        # A string seed hashes the same in every process (no PYTHONHASHSEED involved).
        return random.Random(f"mainspring-faulty:{self.seed}:{index}")

    def fault_at(self, index: int) -> FaultKind | None:
        """The fault that call ``index`` (from 0) meets, ``None`` if it meets none."""
        draw = self._rng(index).random()
        edge = 0.0
        for kind, rate in self.profile.rates().items():
            edge += rate
            if draw < edge:
                return kind
        return None

    async def aclose(self) -> None:
        """Close the inner model."""
        await self.inner.aclose()

    async def request(
        self,
        messages: Sequence[Message],
        *,
        tools: Sequence[ToolSpec] = (),
        settings: ModelSettings | None = None,
    ) -> ModelResponse:
        """Answer through ``inner``, unless this call's fault replaces the answer."""
        index = self.calls
        self.calls += 1
        fault = self.fault_at(index)
        bound = self.profile.max_in_a_row
        if fault is not None and bound is not None and self._in_a_row >= bound:
            fault = None  # the bound: this call passes
        self._in_a_row = self._in_a_row + 1 if fault is not None else 0
        self.history.append(fault)
        if fault is None:
            return await self.inner.request(messages, tools=tools, settings=settings)
        self.injected[fault] += 1
        where = f"{self.name}: injected fault at call {index}"
        if fault == "transient":
            raise TransientError(f"{where}: HTTP 503 service unavailable")
        if fault == "rate_limit":
            raise RateLimited(
                f"{where}: HTTP 429 rate limit reached", retry_after=self.profile.retry_after_s
            )
        if fault == "timeout":
            if self._clock is not None:
                await self._clock.sleep(self.profile.timeout_s)
            else:
                await asyncio.sleep(self.profile.timeout_s)
            raise TransientError(f"{where}: request timed out after {self.profile.timeout_s}s")
        reply = self._bad_reply(fault, index, tools)
        out = (reply.text or "") + "".join(c.name + c.arguments for c in reply.tool_calls)
        usage = Usage(
            input_tokens=estimate_input_tokens(messages, tools),
            output_tokens=estimate_tokens(out),
        )
        return ModelResponse(
            text=reply.text,
            tool_calls=reply.tool_calls,
            finish_reason=reply.finish_reason,
            usage=usage,
            model=self.model_id,
        )

    def _bad_reply(self, fault: FaultKind, index: int, tools: Sequence[ToolSpec]) -> ModelResponse:
        if fault == "refusal":
            return ModelResponse(
                text="I'm sorry, but I can't help with that.", finish_reason="refusal"
            )
        if fault == "empty":
            return ModelResponse(text=None, finish_reason="stop")
        # malformed
        rng = self._rng(index)
        rng.random()  # the draw fault_at used
        if not tools:
            return ModelResponse(
                text='```json\n{"action": "finish", "result": ', finish_reason="stop"
            )
        variant = rng.randrange(len(_MALFORMED_ARGUMENTS))
        name = "" if variant == 2 else tools[rng.randrange(len(tools))].name
        call = ToolCall(id=f"faulty_{index}", name=name, arguments=_MALFORMED_ARGUMENTS[variant])
        return ModelResponse(tool_calls=(call,), finish_reason="tool_calls")
