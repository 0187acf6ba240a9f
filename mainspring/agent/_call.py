"""One model call through the shared rate limiter and the journal: what an agent's turn
does, and what a plain workflow calls (:func:`call_model`, ``App.call_model``).

A call is, in the journal::

    rate:KEY       the booked slot (a step: a replay does not book again); then the run
                   sleeps until it (status sleeping, reason rate_limit, when it is far)
    model:NAME     the request: one step, transient errors retried by its policy

A refusal for rate (429) or an overload (Anthropic's 529, OpenAI's 503 "overloaded")
is back-pressure, not a failure. It ends the model step at once, so it spends none of
the step's attempts; the limiter learns from the refusal's headers and its
``retry-after``; and the call books again and waits as long as the provider asks,
then sends again as a new ``rate:KEY`` + ``model:NAME`` pair. Nothing bounds that wait
but ``max_rate_wait_s``: past it, the run pauses and asks a human
(``budget:max_rate_wait_s``), as the budgets do. Without a limiter (an App with no
``rate_limits``) the call waits the refusal's ``retry-after`` (a growing back-off
when it has none) as a journaled ``rate:wait:NAME`` step and a durable wait.

Every wait goes through the run's clock (``RunContext.sleep_until``): an in-process
sleep only when it is shorter than the App's ``inline_wait_s``, otherwise the run
leaves its worker; a test's FakeClock drives all of them. The limiter comes bound to
the store and clock of the App (:meth:`RateLimits.bind`); the clock, randomness and
``inline_wait_s`` are the App's too, passed in by it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import inspect
import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .._clock import Clock, SystemClock
from .._errors import (
    BudgetExceeded,
    ConfigError,
    Overloaded,
    RateLimited,
    StepFailed,
    StoreError,
    StoreUnavailable,
)
from ..context import counter_for
from ..hitl import approval
from ..journal import RetryPolicy, RunContext, SimulatedCrash, current_step
from ..limits import (
    Booking,
    BoundRateLimits,
    Cost,
    Price,
    RateLimits,
    StoreRateLimiter,
    cost_usd,
    price_of,
)
from ..models import (
    Message,
    Model,
    ModelResponse,
    ModelSettings,
    ToolCallDelta,
    ToolSpec,
    model_step_name,
    resolve_model,
)

__all__ = ["DEFAULT_MODEL_RETRY", "SlotLapsed", "call_model"]

#: The back-off of transient model errors (network, 5xx) when none is given.
# Transient model errors (5xx, timeouts, a dropped stream) must almost never end a
# long run: at 10 % of calls failing, 4 attempts lost a call in 10^4, about one
# 1,000-step run in ten (the lab's horizon suite); 8 attempts lose one in 10^8, after
# at most about 1.5 minutes of back-off.
DEFAULT_MODEL_RETRY = RetryPolicy(max_attempts=8, initial_s=1.0, max_s=30.0)
# At most this long before its rate-limit slot a run is back on a worker.
_MAX_LEAD_S = 1.0
# The back-off after a refusal that does not say how long to wait: 1 s doubling to this.
_MAX_BACKOFF_S = 60.0


# One adapter per spec string (an adapter holds an HTTP client per event loop).
_BY_SPEC: dict[str, Model] = {}
# Back-off jitter when the caller gives no randomness of its own.
_RNG = random.Random()


class SlotLapsed(RateLimited):
    """A booked slot passed before its request could go (a late start, a retried
    step) and the next free one is not near: the call books again and waits, as
    after a 429. Internal: it never leaves :func:`call_model`."""


def _qualified(cls: type[BaseException]) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


# What a failed model step's error_type says, as the journal keeps it.
_RATE = _qualified(RateLimited)
_OVERLOADED = _qualified(Overloaded)
_LAPSED = _qualified(SlotLapsed)


async def call_model(
    ctx: RunContext,
    model: Model | str,
    messages: Sequence[Message],
    *,
    tools: Sequence[ToolSpec] = (),
    settings: ModelSettings | None = None,
    rate_limits: BoundRateLimits | None = None,
    account: str = "default",
    retry: RetryPolicy | None = None,
    max_rate_wait_s: float | None = None,
    prompt_tokens: int | None = None,
    prices: dict[str, Price] | None = None,
    clock: Clock | None = None,
    rng: random.Random | None = None,
    inline_wait_s: float = 1.0,
    reply_type: type[ModelResponse] = ModelResponse,
) -> ModelResponse:
    """Call ``model`` as a journaled step, through the shared rate limiter.

    A replay returns the journaled reply without calling the model. Use it from any
    workflow; ``App.call_model`` passes the App's rate limits for you::

        @app.workflow
        async def summarise(ctx: ms.RunContext, text: str) -> str:
            messages = [UserMessage(content=text)]
            reply = await app.call_model(ctx, "openai:gpt-4.1-mini", messages)
            return reply.text or ""

    Args:
        ctx: the run's context.
        model: a :class:`~mainspring.models.Model` or a spec (``"openai:gpt-4.1-mini"``).
        messages: the conversation, oldest first.
        tools: the tools the model may call.
        settings: sampling settings (``max_tokens`` also caps the output reserved).
        rate_limits: the limits to book against, bound to their store and clock
            (``app.rate_limits.bind(app.store, app.clock)``; ``None``: no limiter;
            refusals are still waited out, never fatal).
        account: which account's limits (``RateLimit.account``).
        retry: back-off for transient errors (network, 5xx); rate refusals and
            overloads never spend its attempts.
        max_rate_wait_s: how long refusals may hold this call back before the run
            pauses and asks a human (``budget:max_rate_wait_s``); ``None``: no bound.
        prompt_tokens: the prompt's token count if already known (else counted).
        prices: USD per million tokens by model id (default: ``limits.PRICES``): the
            reply's ``cost_usd`` is journaled with it, so that ``show``/``trace`` with
            only ``--db`` see the cost the caller's table gave.
        clock: the run's clock (default: the limits', else the system's).
        rng: randomness for the jitter of back-offs.
        inline_wait_s: the App's ``inline_wait_s``: a booked slot is slept for in
            process when the run wakes this close to it.
        reply_type: the class of the replies ``model`` returns, a subclass of
            :class:`~mainspring.models.ModelResponse` with fields of its own (an
            integration's native reply): the journaled reply is revived as it, so a
            replay sees those fields too.

    Raises:
        StepFailed: the call failed for good (not for rate: that only waits).
        BudgetExceeded: ``max_rate_wait_s`` passed and a human said stop.
    """
    if isinstance(model, str):
        found = _BY_SPEC.get(model)
        if found is None:
            found = _BY_SPEC[model] = resolve_model(model)
        model = found
    if isinstance(rate_limits, RateLimits):
        raise ConfigError(
            "call_model needs rate limits bound to the run's store and clock: pass "
            "rate_limits.bind(app.store, app.clock), or call app.call_model(...)",
            run_id=ctx.run_id,
        )
    limiter = None
    if rate_limits is not None and rate_limits.applies(
        model.provider, model.model_id, account, remote=model.remote
    ):
        limiter = rate_limits.limiter(model.provider, model.model_id, account)
        if prompt_tokens is None:
            prompt_tokens = counter_for(model.provider).messages(messages, tools)
    base = retry or DEFAULT_MODEL_RETRY
    call = _Call(
        ctx=ctx,
        model=model,
        messages=messages,
        tools=tools,
        settings=settings,
        prices=prices,
        limiter=limiter,
        clock=clock or (rate_limits.clock if rate_limits is not None else SystemClock()),
        rng=rng or _RNG,
        inline_wait_s=inline_wait_s,
        policy=dataclasses.replace(
            base, non_retryable=(*base.non_retryable, RateLimited, Overloaded)
        ),
        prompt_tokens=prompt_tokens or 0,
        max_rate_wait_s=max_rate_wait_s,
        reply_type=reply_type,
    )
    return await call.run()


@dataclass(kw_only=True, eq=False)
class _Call:
    """One model call being made: booked, sent, and booked again after refusals."""

    ctx: RunContext
    model: Model
    messages: Sequence[Message]
    tools: Sequence[ToolSpec]
    settings: ModelSettings | None
    prices: dict[str, Price] | None
    limiter: StoreRateLimiter | None
    clock: Clock
    rng: random.Random
    inline_wait_s: float
    policy: RetryPolicy
    prompt_tokens: int
    max_rate_wait_s: float | None
    reply_type: type[ModelResponse] = ModelResponse
    held_since: float | None = None  # journaled time of this call's first refusal
    refusals: int = 0

    async def run(self) -> ModelResponse:
        m = self.model
        if self.limiter is not None and self.ctx.upcoming_role() == "model":
            # The journal holds this call without a booking before it: it was made by
            # code with no limiter (before rate limits were on by default). Replay it as
            # it was, booking nothing, or the steps would not line up.
            self.limiter = None
        while True:
            booking: Booking | None = None
            if self.limiter is not None:
                booking = await self._slot(self.limiter)
                if booking is None:
                    continue
            fallback = _backoff(self.refusals + 1, self.rng)

            async def send(
                messages: Sequence[Message],
                booked: Booking | None = booking,
                fallback: float = fallback,
            ) -> ModelResponse:
                request = functools.partial(self._request, messages)
                if self.limiter is None or booked is None:
                    return await request()
                return await _send_booked(
                    self.limiter,
                    booked,
                    request,
                    warm=m.warm,
                    fallback_wait=fallback,
                    inline_s=self.inline_wait_s,
                )

            try:
                response: ModelResponse = await self.ctx.step(
                    send if self.reply_type is ModelResponse else _returning(send, self.reply_type),
                    # an argument, so that interceptors (content capture) see them
                    self.messages,
                    name=model_step_name(m.provider, m.model_id),
                    retry=self.policy,
                    role="model",
                )
                return response
            except StepFailed as exc:
                if exc.error_type not in (_RATE, _OVERLOADED, _LAPSED):
                    raise
                kind, cause = exc.error_type, exc.__cause__
            if kind != _LAPSED:  # a lapse is no refusal: only a slot that passed
                await self._refused(kind, cause, fallback)

    async def _request(self, messages: Sequence[Message]) -> ModelResponse:
        m, prices = self.model, self.prices
        if m.streams:  # its output goes out live as it forms; the journal keeps the reply
            writer = self.ctx.token_writer()
            extra: dict[str, Callable[[ToolCallDelta], None]] = {}
            if _takes_tool_calls(type(m).stream):
                extra["on_tool_call"] = lambda d: writer.tool_call(
                    d.index, d.id, d.name, d.arguments
                )
            try:
                reply = await m.stream(
                    messages,
                    tools=self.tools,
                    settings=self.settings,
                    on_text=writer.write,
                    **extra,
                )
            except SimulatedCrash:
                raise  # the process "died": it writes nothing more, as a real crash
            except BaseException:
                await writer.close("failed")
                raise
            await writer.close("done")
        else:
            reply = await m.request(messages, tools=self.tools, settings=self.settings)
        if price_of(m.model_id, prices) is None:
            return reply
        return dataclasses.replace(reply, cost_usd=cost_usd(m.model_id, reply.usage, prices))

    async def _slot(self, limiter: StoreRateLimiter) -> Booking | None:
        """Book the next slot and sleep until shortly before it; ``None``: book again."""
        ctx = self.ctx
        max_tokens = self.settings.max_tokens if self.settings is not None else None
        trim = max_tokens is None  # the reservation is a default: a limit may cap it
        if max_tokens is None:
            max_tokens = getattr(self.model, "max_tokens", None)  # Anthropic's default cap
        booking = await _book(ctx, limiter, self.prompt_tokens, max_tokens, trim)
        if booking.retry:  # a cold limiter: another request is learning the limits
            await self._at_gate(limiter, booking.wake_at)
            return None
        if self._past_bound(booking.wake_at):
            # Give the slot back while a human decides (that may take hours).
            await ctx.step(
                functools.partial(limiter.settle_quietly, booking, None),
                name=f"rate-refund:{limiter.key}",
                role="rate",
            )
            await self._ask_to_wait()
            return None
        lead = min(0.5 * self.inline_wait_s, _MAX_LEAD_S)
        await ctx.sleep_until(booking.wake_at - lead, reason="rate_limit")
        return booking

    async def _at_gate(self, limiter: StoreRateLimiter, wake_at: float) -> None:
        """Wait until the cold limiter's gate would let this run book: a booking
        turned it away (journaled once), and it looks again every poll without
        journaling each look (``StoreRateLimiter.gate``), so that a long hold is one
        ``rate:`` row, not four a second."""
        ctx = self.ctx
        while True:
            await ctx.sleep_until(wake_at, reason="rate_limit")
            if ctx.is_replaying:
                return  # the journal goes on past this wait: it ended, and was booked
            try:
                ahead = await asyncio.to_thread(limiter.gate, run=ctx.run_id)
            except (StoreError, StoreUnavailable):
                return  # book again: the booking, a step, rides out a store that is down
            if ahead is None:
                return
            wake_at = self.clock.now() + ahead

    async def _refused(self, kind: str, cause: BaseException | None, fallback: float) -> None:
        """After a refusal (429) or an overload: wait before the call books again."""
        ctx, m = self.ctx, self.model
        self.refusals += 1
        now = ctx.now().timestamp()
        if self.held_since is None:
            self.held_since = now
        if self.limiter is not None and kind == _RATE:
            return  # the limiter learned the wait: the next booking starts after it
        # No limiter, or an overload (not this account's limits): wait what the
        # provider asked, else a growing back-off, journaled so a replay waits the same.
        asked = getattr(cause, "retry_after", None)
        wake_at: float = await ctx.step(
            functools.partial(_wake_at, self.clock, asked, fallback),
            name=f"rate:wait:{m.provider}:{m.model_id}",
            role="wait",
        )
        if self._past_bound(wake_at):
            await self._ask_to_wait()
            return
        await ctx.sleep_until(wake_at, reason="rate_limit")

    def _past_bound(self, wake_at: float) -> bool:
        """Would waiting until ``wake_at`` pass ``max_rate_wait_s`` since the first refusal?"""
        return (
            self.held_since is not None
            and self.max_rate_wait_s is not None
            and wake_at - self.held_since > self.max_rate_wait_s
        )

    async def _ask_to_wait(self) -> None:
        assert self.held_since is not None and self.max_rate_wait_s is not None
        self.held_since, self.max_rate_wait_s = await _ask_to_wait(
            self.ctx, self.model, self.held_since, self.max_rate_wait_s, self.refusals
        )


def _returning(
    send: Callable[..., Awaitable[ModelResponse]], reply_type: type[ModelResponse]
) -> Callable[..., Awaitable[ModelResponse]]:
    """``send`` declaring ``reply_type`` as its return: what the journal revives."""

    async def typed(*args: Any, **kwargs: Any) -> ModelResponse:
        return await send(*args, **kwargs)

    typed.__annotations__ = {"return": reply_type}
    return typed


@functools.lru_cache(maxsize=256)
def _takes_tool_calls(stream: Callable[..., object]) -> bool:
    """Does a model's ``stream`` take ``on_tool_call``? (One written before it existed
    does not: its text alone is streamed.)"""
    try:
        params = inspect.signature(stream).parameters
    except (TypeError, ValueError):  # no signature to read: assume the older one
        return False
    return "on_tool_call" in params or any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()
    )


def _backoff(refusals: int, rng: random.Random) -> float:
    """1 s doubling to a minute, jittered by ±25 % so that refused runs do not
    come back in a herd."""
    cap = min(_MAX_BACKOFF_S, 2.0 ** (refusals - 1))
    return cap * rng.uniform(0.75, 1.25)


def _wake_at(clock: Clock, asked: float | None, fallback: float) -> float:
    return clock.now() + (asked if asked is not None and asked > 0 else fallback)


async def _book(
    ctx: RunContext,
    limiter: StoreRateLimiter,
    prompt_tokens: int,
    max_tokens: int | None,
    trim: bool,
) -> Booking:
    """Book a slot for the next model call (a journaled step: a replay does not book
    again). ``trim``: ``max_tokens`` is a default, not the caller's: a smaller token
    limit caps the output reserved (see :meth:`StoreRateLimiter.reserve`)."""

    def book_slot() -> Booking:
        return limiter.reserve(
            prompt_tokens=prompt_tokens, max_tokens=max_tokens, run=ctx.run_id, trim_output=trim
        )

    booking: Booking = await ctx.step(book_slot, name=f"rate:{limiter.key}", role="rate")
    return booking


async def _ask_to_wait(
    ctx: RunContext, model: Model, held_since: float, cap: float, refusals: int
) -> tuple[float, float]:
    """``max_rate_wait_s`` has passed: pause for a human. Approve to keep waiting
    (edit ``{"limit": seconds}`` for another bound), reject to stop."""
    waited = ctx.now().timestamp() - held_since
    decision = await approval(
        ctx,
        "budget:max_rate_wait_s",
        title=f"the provider has held back {model.name!r} for {waited:.0f} s "
        f"({refusals} refusal(s); max_rate_wait_s={cap:g}): keep waiting?",
        preview={
            "limit": "max_rate_wait_s",
            "cap": cap,
            "waited_s": round(waited, 3),
            "refusals": refusals,
            "model": model.name,
        },
    )
    if not decision.approved:
        raise BudgetExceeded(
            f"max_rate_wait_s reached ({waited:.0f} s of {cap:g} s held back by "
            f"{model.name!r}); stopped by a human",
            run_id=ctx.run_id,
        )
    raised = (decision.arguments or {}).get("limit", cap)
    return ctx.now().timestamp(), float(raised)


async def _send_booked(
    limiter: StoreRateLimiter,
    booking: Booking,
    send: Callable[[], Awaitable[ModelResponse]],
    *,
    warm: Callable[[], Awaitable[None]] | None,
    fallback_wait: float,
    inline_s: float,
) -> ModelResponse:
    """Send a booked request and settle its booking.

    A request that starts late (a slow worker, a retry of the step) would overtake
    the bookings made after its own: its booking is refunded and a new one taken,
    behind the others (in one transaction: see :meth:`StoreRateLimiter.rebook`),
    and slept for in process if it is within ``inline_s`` (the App's
    ``inline_wait_s``, as any short wait); if not, the step ends with
    :class:`SlotLapsed` and the caller waits for it durably. A refused request charged
    nothing: it is refunded, and the refusal's headers and ``retry-after`` (else
    ``fallback_wait``) tighten the limiter before the refusal goes up. ``warm`` runs
    first: a worker's first request builds its HTTP client, and a send that leaves
    long after the lateness check lands on a bucket that was full meanwhile.
    """
    if warm is not None:
        await warm()
    clock = limiter.clock
    attempt = current_step().attempt
    # The run woke a little before its slot (at most lead_s): sleep the rest here,
    # after the step's own bookkeeping, so that the send leaves on time.
    early = booking.wake_at - clock.now()
    if early > 0 and attempt == 1:
        await clock.sleep(early)
    # Lateness spends headroom (the capacity a late request's slot refilled is
    # booked again by others): allow a quarter of it, then book anew.
    rate = limiter.rate
    late_s = max(0.25 * rate.headroom, 0.005) * rate.period_s
    current = booking
    if attempt > 1 or clock.now() - current.wake_at > late_s:
        # One transaction: a refund, then a booking, would let a run waiting behind
        # a cold limiter's probe take it in between (the re-sent probe then waits).
        run = current_step().run_id
        current = await asyncio.to_thread(functools.partial(limiter.rebook, current, run=run))
        wait = current.wake_at - clock.now()
        if wait > inline_s or current.retry:
            if not current.retry:
                await asyncio.to_thread(limiter.settle_quietly, current, None)
            raise SlotLapsed(
                f"the slot booked for this request passed; the next is {wait:.3f}s away",
                retry_after=wait,
            )
        await clock.sleep(wait)
    try:
        reply = await send()
    except RateLimited as exc:
        asked = exc.retry_after if exc.retry_after is not None else fallback_wait
        await asyncio.to_thread(
            limiter.settle_quietly, current, None, exc.headers, retry_after=asked
        )
        raise
    except Overloaded:
        await asyncio.to_thread(limiter.settle_quietly, current, None)
        raise
    used = Cost(
        input_tokens=reply.usage.input_tokens,
        cached_tokens=reply.usage.cache_read_tokens,
        output_tokens=reply.usage.output_tokens,
    )
    await asyncio.to_thread(limiter.settle_quietly, current, used, reply.rate_limit)
    return reply
