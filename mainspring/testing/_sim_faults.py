"""The faults a simulated run draws from its seed, and how often."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ._faults import Fault

__all__ = ["FaultMix", "store_faults"]


@dataclass(frozen=True, slots=True, kw_only=True)
class FaultMix:
    """How often each fault strikes (0 turns it off).

    Attributes:
        crash: chance, at each await point of a worker process, that the process dies
            there (its memory gone, the store kept); another starts after a while.
        freeze: chance, at each await point, that the process stops for between half
            a lease and three leases (a GC pause, a stopped VM) and then goes on.
        busy: chance that a store call finds the store busy (nothing done).
        ambiguous: chance that a commit succeeds and its answer is lost.
        clock_jump: chance, at each outside tick (about one a second), that every
            clock jumps forward by one to two leases (leases expire under runs).
        outside: the mean virtual seconds between outside actions (signal, cancel,
            a duplicate submit); 0 turns them off.
        provider: chance that a model call fails (5xx, 429, timeout, malformed);
            the agent workload's.
        skew: each process's clock is off by up to this many seconds either way
            (drawn when it starts), a fraction of a lease by default.
    """

    crash: float = 1 / 1500
    freeze: float = 1 / 4000
    busy: float = 0.01
    ambiguous: float = 0.005
    clock_jump: float = 0.002
    outside: float = 5.0
    provider: float = 0.1
    skew: float = 1.0

    @classmethod
    def none(cls) -> FaultMix:
        """No faults at all: the schedule alone varies with the seed."""
        return cls(
            crash=0, freeze=0, busy=0, ambiguous=0, clock_jump=0, outside=0, provider=0, skew=0
        )


def store_faults(
    mix: FaultMix, rng: random.Random, dead: Callable[[], bool], note: Callable[[str], None]
) -> list[Fault]:
    """A process's store faults: everything refused once it is dead (what a dead
    process's ``finally`` would try), else busy and ambiguous calls drawn from
    ``rng``, each told to ``note``."""

    def gone(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        return dead()

    def chance(p: float, what: str) -> Callable[[tuple[Any, ...], dict[str, Any]], bool]:
        def when(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
            if p <= 0 or rng.random() >= p:
                return False
            note(what)
            return True

        return when

    never = 1 << 62
    return [
        Fault(kind="busy", when=gone, times=never),
        Fault(kind="busy", when=chance(mix.busy, "busy"), times=never),
        Fault(
            kind="ambiguous", method="commit", when=chance(mix.ambiguous, "ambiguous"), times=never
        ),
    ]
