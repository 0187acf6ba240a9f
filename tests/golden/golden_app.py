"""Workflows whose journals are saved in tests/golden/ and replayed by every later version.

Never change these functions: a saved journal is only meaningful with the code that
wrote it. To cover new journal features, add new workflows and a new golden file.
"""

from __future__ import annotations

import mainspring as ms
from mainspring.testing import SimulatedCrash

CALLS: list[str] = []  # every step execution, as "name:arg"
CRASH_AT: set[str] = set()  # "name:arg" of steps that die (only while making the file)


class Crash(SimulatedCrash):
    """The process dies here: nothing after it is written."""


def record(name: str, arg: object) -> None:
    CALLS.append(f"{name}:{arg}")
    if f"{name}:{arg}" in CRASH_AT:
        CRASH_AT.discard(f"{name}:{arg}")
        raise Crash


def double(n: int) -> int:
    record("double", n)
    return n * 2


async def shout(text: str) -> str:
    record("shout", text)
    return text.upper()


def charge(cents: int) -> dict[str, object]:
    record("charge", cents)
    return {"charged": cents, "key": ms.current_step().idempotency_key}


def flaky(n: int) -> int:
    record("flaky", n)
    if ms.current_step().attempt < 2:
        raise ConnectionError("first attempt always fails")
    return n


def refuse(n: int) -> int:
    record("refuse", n)
    raise ValueError(f"refused {n}")


def build(app: ms.App) -> None:
    @app.workflow
    async def sleeper(ctx: ms.RunContext, n: int) -> list[int]:
        values = [await ctx.step(double, i) for i in range(n)]
        await ctx.sleep(3600)
        values.append(await ctx.step(double, 100))
        return values

    @app.workflow
    async def waiter(ctx: ms.RunContext, word: str) -> dict[str, object]:
        loud = await ctx.step(shout, word)
        when = ctx.now()
        ident = ctx.uuid()
        roll = ctx.random()
        approval = await ctx.wait_for("approve", timeout=7 * 86400)
        retried = await ctx.step(flaky, 7, retry=ms.RetryPolicy(max_attempts=3, initial_s=0))
        try:
            await ctx.step(refuse, 1, retry=ms.RetryPolicy.never())
            refused = "no"
        except ms.StepFailed as exc:
            refused = exc.error_type
        return {
            "loud": loud,
            "when": when.isoformat(),
            "uuid": str(ident),
            "roll": roll,
            "approval": approval,
            "retried": retried,
            "refused": refused,
        }

    @app.workflow
    async def crasher(ctx: ms.RunContext, n: int) -> list[object]:
        out: list[object] = [await ctx.step(double, i) for i in range(n)]
        out.append(await ctx.step(charge, 500))
        try:
            out.append(await ctx.step(charge, 700, mode="at_most_once"))
        except ms.StepInterrupted:
            out.append("interrupted")
        return out

    @app.workflow
    async def sessions(ctx: ms.RunContext, per_session: int, total: int) -> dict[str, int]:
        done = ctx.handoff["done"] if ctx.handoff else 0
        for _ in range(per_session):
            if done >= total:
                signal = await ctx.wait_for("finish")
                return {"done": done, "session": ctx.session, "signal": signal}
            done += await ctx.step(double, done) - done
            done += 1
        ctx.continue_as_new({"done": done})
