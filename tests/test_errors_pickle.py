"""Every error mainspring raises crosses a process boundary intact: a process pool, a
multiprocessing queue or pytest-xdist pickles it, and what comes back is the same
error (type, message, every attribute), not a ``TypeError`` from ``__init__``."""

from __future__ import annotations

import inspect
import pickle
from typing import Any

import pytest

import mainspring as ms
from mainspring import _errors

ERRORS = sorted(
    (
        cls
        for cls in vars(_errors).values()
        if inspect.isclass(cls)
        and issubclass(cls, BaseException)
        and cls.__module__ == _errors.__name__
    ),
    key=lambda cls: cls.__name__,
)


def _an_instance(cls: type[BaseException]) -> BaseException:
    """``cls`` built with a distinct value for each of its arguments."""
    values: dict[str, Any] = {}
    args: list[Any] = []
    for i, p in enumerate(list(inspect.signature(cls.__init__).parameters.values())[1:]):
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        value: Any = 1.5 if p.name in ("retry_after", "attempts") else f"{p.name}-{i}"
        if p.name == "requests":
            value = []
        if p.name == "headers":
            value = {"retry-after": "2"}
        if p.kind == p.KEYWORD_ONLY:
            values[p.name] = value
        else:
            args.append(value)
    return cls(*args, **values)


def test_every_error_class_is_covered() -> None:
    assert ms.StepFailed in ERRORS and ms.Cancelled in ERRORS and len(ERRORS) > 30


@pytest.mark.parametrize("cls", ERRORS, ids=lambda cls: cls.__name__)
def test_an_error_comes_back_from_a_pickle_as_it_was(cls: type[BaseException]) -> None:
    exc = _an_instance(cls)
    back = pickle.loads(pickle.dumps(exc))
    assert type(back) is cls
    assert str(back) == str(exc)
    assert back.args == exc.args
    assert vars(back) == vars(exc)
    if isinstance(exc, ImportError):
        assert isinstance(back, ImportError) and back.name == exc.name


def test_a_step_failure_keeps_what_the_caller_reads() -> None:
    exc = ms.StepFailed(
        "charge failed", error_type="ValueError", attempts=3, run_id="r1", step="0:2 'charge'"
    )
    back = pickle.loads(pickle.dumps(exc))
    assert (back.error_type, back.attempts, back.run_id, back.step) == (
        "ValueError", 3, "r1", "0:2 'charge'",
    )  # fmt: skip
    assert str(back) == "charge failed (run r1, step 0:2 'charge')"
