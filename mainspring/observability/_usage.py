"""What runs spent: tokens and cost per run, and a parent's with its children's.

A run's usage is read from its completed model calls only (``Store.model_steps``),
so a list of fifty runs costs one query, not fifty journals. A parent's totals come
with and without its children (child runs started by ``ctx.child``, and theirs): a
parent that delegates its work to children shows what the work cost, not "0 tokens".
A fork's copied rows count nothing (the source run spent them).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..limits import Price, cost_usd
from ..models import Usage as ModelUsage
from ..storage import RunRecord, StepRecord
from ._names import price_key

__all__ = [
    "ChildUsage",
    "Family",
    "Usage",
    "family_usage",
    "reply_cost",
    "reply_usage",
    "run_duration",
    "usage_by_run",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class Usage:
    """Tokens and cost of model calls.

    Attributes:
        tokens_in / tokens_out: as the providers reported them.
        cost_usd: priced as the run's trace prices them (0 for unpriced models).
        model_calls: completed model calls counted.
    """

    tokens_in: int = 0
    tokens_out: int = 0
    cost_usd: float = 0.0
    model_calls: int = 0

    @property
    def tokens(self) -> int:
        return self.tokens_in + self.tokens_out

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            tokens_in=self.tokens_in + other.tokens_in,
            tokens_out=self.tokens_out + other.tokens_out,
            cost_usd=self.cost_usd + other.cost_usd,
            model_calls=self.model_calls + other.model_calls,
        )

    def to_json(self) -> dict[str, float | int]:
        return {
            "tokens_in": self.tokens_in,
            "tokens_out": self.tokens_out,
            "cost_usd": round(self.cost_usd, 6),
            "model_calls": self.model_calls,
        }


def reply_usage(reply: Mapping[str, Any]) -> ModelUsage:
    """The tokens a journaled model reply reports (a count it leaves out is 0): read
    one way for a trace's model rows and for a list's totals, so the two agree."""
    raw = reply.get("usage") or {}
    return ModelUsage(
        input_tokens=int(raw.get("input_tokens", 0)),
        output_tokens=int(raw.get("output_tokens", 0)),
        cache_read_tokens=int(raw.get("cache_read_tokens", 0)),
        cache_write_tokens=int(raw.get("cache_write_tokens", 0)),
    )


def reply_cost(
    reply: Mapping[str, Any],
    model_id: str,
    usage: ModelUsage,
    prices: Mapping[str, Price] | None,
) -> float:
    """What a journaled model reply cost: the cost journaled with it (the caller's price
    table at the time), else ``usage`` priced now from ``prices`` (``None``: the default
    table)."""
    journaled = reply.get("cost_usd")
    if isinstance(journaled, int | float):
        return journaled
    return cost_usd(model_id, usage, None if prices is None else dict(prices))


def usage_by_run(
    steps: Sequence[StepRecord], prices: Mapping[str, Mapping[str, Price] | None]
) -> dict[str, Usage]:
    """The usage of each run among ``steps`` (model calls, any runs mixed), priced
    with ``prices[run_id]`` (a run missing there: the default price table)."""
    # Read as the trace reads a model row (``reply_usage``, ``reply_cost``), without
    # the summaries a trace also builds: a list of fifty long runs reads thousands of rows.
    out: dict[str, list[float]] = {}
    for s in steps:
        if s.status != "completed" or s.epoch == 0:  # epoch 0: a fork's copy
            continue
        totals = out.setdefault(s.run_id, [0, 0, 0.0, 0])
        totals[3] += 1
        try:
            reply = json.loads(s.output) if s.output is not None else None
        except ValueError:
            continue
        if not isinstance(reply, dict):
            continue
        used = reply_usage(reply)
        totals[0] += used.input_tokens
        totals[1] += used.output_tokens
        totals[2] += reply_cost(reply, price_key(s.name), used, prices.get(s.run_id))
    return {
        run_id: Usage(
            tokens_in=int(t[0]), tokens_out=int(t[1]), cost_usd=t[2], model_calls=int(t[3])
        )
        for run_id, t in out.items()
    }


def run_duration(run: RunRecord, now: float) -> float:
    """Seconds from submission to the end (to ``now`` while it has not ended)."""
    end = run.finished_at if run.finished_at is not None else now
    return max(0.0, end - run.created_at)


@dataclass(frozen=True, slots=True, kw_only=True)
class ChildUsage:
    """One child run of a parent, with what it and its own children spent.

    Attributes:
        run: the child's record (a summary).
        own: the child's own model calls.
        total: the child's and all its descendants'.
        descendants: how many runs below the child were counted.
        duration_s: the child's duration (to now while it runs).
    """

    run: RunRecord
    own: Usage
    total: Usage
    descendants: int
    duration_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Family:
    """A run's spending with and without its children's.

    Attributes:
        own: the run's own model calls.
        children: its direct children, in the order it started them.
        with_children: the run's and every descendant's together.
        duration_s: the run's duration (to now while it runs).
        truncated: the tree was larger than the limit and partly left out.
    """

    own: Usage
    children: tuple[ChildUsage, ...]
    with_children: Usage
    duration_s: float
    truncated: bool = False

    @property
    def children_total(self) -> Usage:
        total = Usage()
        for c in self.children:
            total = total + c.total
        return total

    def to_json(self) -> dict[str, object]:
        return {
            "own": self.own.to_json(),
            "children": self.children_total.to_json(),
            "with_children": self.with_children.to_json(),
            "duration_s": round(self.duration_s, 3),
            "truncated": self.truncated,
            "child_runs": [
                {
                    "id": c.run.id,
                    "workflow": c.run.workflow,
                    "status": c.run.status,
                    "duration_s": round(c.duration_s, 3),
                    "descendants": c.descendants,
                    **c.total.to_json(),
                }
                for c in self.children
            ],
        }


def family_usage(
    run: RunRecord,
    children_of: Callable[[str], Sequence[RunRecord]],
    usage_of: Callable[[Sequence[RunRecord]], Mapping[str, Usage]],
    now: float,
    *,
    limit: int = 10_000,
) -> Family:
    """``run``'s :class:`Family`: its children (``children_of``, in start order) and
    theirs, down the tree, up to ``limit`` runs; ``usage_of`` reads the usage of many
    runs at once."""
    tree: dict[str, list[RunRecord]] = {}
    level = [run]
    seen = 1
    truncated = False
    while level and not truncated:
        nxt: list[RunRecord] = []
        for r in level:
            kids = list(children_of(r.id))
            if seen + len(kids) > limit:
                kids = kids[: max(0, limit - seen)]
                truncated = True
            tree[r.id] = kids
            seen += len(kids)
            nxt.extend(kids)
        level = nxt
    everyone = [run, *(k for kids in tree.values() for k in kids)]
    usage = usage_of(everyone)

    def subtree(r: RunRecord) -> tuple[Usage, int]:
        total, count = usage.get(r.id, Usage()), 0
        stack = list(tree.get(r.id, []))
        while stack:
            k = stack.pop()
            total, count = total + usage.get(k.id, Usage()), count + 1
            stack.extend(tree.get(k.id, []))
        return total, count

    children = []
    for c in tree.get(run.id, []):
        total, count = subtree(c)
        children.append(
            ChildUsage(
                run=c,
                own=usage.get(c.id, Usage()),
                total=total,
                descendants=count,
                duration_s=run_duration(c, now),
            )
        )
    own = usage.get(run.id, Usage())
    with_children = own
    for child in children:
        with_children = with_children + child.total
    return Family(
        own=own,
        children=tuple(children),
        with_children=with_children,
        duration_s=run_duration(run, now),
        truncated=truncated,
    )
