"""Users see the names they import: ``mainspring.App``, not ``mainspring._app._core.App``.

``mainspring._home.publish`` moves ``__module__`` of exported classes and functions to
their public home (as httpx does). Reprs and docs name that home; ``pickle``, which finds
a class again by ``__module__`` and ``__qualname__``, still round-trips; typing and
pydantic still read every annotation; errors keep the module the journal records.
"""

from __future__ import annotations

import importlib
import inspect
import pickle
import typing
from typing import Any

import pytest

import mainspring as ms
import mainspring.testing

PACKAGES = [
    "mainspring", "mainspring.agent", "mainspring.context", "mainspring.hitl",
    "mainspring.journal", "mainspring.limits", "mainspring.models", "mainspring.observability",
    "mainspring.serde", "mainspring.storage", "mainspring.tools", "mainspring.worker",
    "mainspring.testing",
]  # fmt: skip


def _exported() -> list[tuple[str, str, Any]]:
    found = []
    for package in PACKAGES:
        module = importlib.import_module(package)
        for name in module.__all__:
            obj = getattr(module, name)
            if inspect.isclass(obj) or inspect.isfunction(obj):
                found.append((package, name, obj))
    return found


def test_users_see_the_public_home() -> None:
    assert repr(ms.App) == "<class 'mainspring.App'>"
    assert f"{ms.RunContext.__module__}.{ms.RunContext.__qualname__}" == "mainspring.RunContext"
    assert ms.RetryPolicy.__module__ == "mainspring"
    assert ms.current_step.__module__ == "mainspring"
    assert mainspring.testing.FaultyStore.__module__ == "mainspring.testing"
    assert ms.models.ScriptedModel.__module__ == "mainspring.models"
    assert repr(ms.FakeClock(5.0)).startswith("<mainspring.FakeClock object at")
    assert repr(ms.RetryPolicy(max_attempts=2)).startswith("RetryPolicy(")  # a dataclass's
    moved = [o for _, _, o in _exported() if not o.__module__.split(".")[-1].startswith("_")]
    assert len(moved) >= 100


@pytest.mark.parametrize(
    ("package", "name", "obj"), [pytest.param(*e, id=f"{e[0]}.{e[1]}") for e in _exported()]
)
def test_every_export_is_found_where_it_says_it_lives(package: str, name: str, obj: Any) -> None:
    home = importlib.import_module(obj.__module__)
    assert getattr(home, obj.__qualname__) is obj, f"{package}.{name} -> {obj.__module__}"
    assert pickle.loads(pickle.dumps(obj)) is obj
    if inspect.isclass(obj):
        typing.get_type_hints(obj)  # typing and pydantic read annotations in that home


def test_errors_keep_the_module_the_journal_records() -> None:
    """A journaled error's type is ``module.qualname``, and replay compares it (a 429 is
    told from a failure by it): moving errors would change that under old journals."""
    errors = [o for _, _, o in _exported() if inspect.isclass(o) and issubclass(o, BaseException)]
    assert len(errors) >= 20
    assert not [e for e in errors if e.__module__ in PACKAGES]
    assert ms.StepFailed.__module__ == "mainspring._errors"


def test_values_of_moved_classes_round_trip() -> None:
    assert pickle.loads(pickle.dumps(ms.FakeClock(5.0))).now() == 5.0
    values: list[Any] = [
        ms.RetryPolicy(max_attempts=3),
        ms.Limits(max_steps=4),
        ms.ContextPolicy(),
        ms.models.UserMessage(content="hi"),
    ]
    for value in values:
        assert pickle.loads(pickle.dumps(value)) == value, type(value)
    policy = ms.RetryPolicy(max_attempts=3)
    assert ms.serde.revive(ms.serde.loads(ms.serde.dumps(policy)), ms.RetryPolicy) == policy
