"""The layers stay untangled: imports point down, through public doors only.

The rules are in ``tests/_layers.py``. Each is also run on a small package with one
planted violation, so that a rule that stopped seeing anything fails here too.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest
from _layers import RANKS, Violation, check, part_of

import mainspring

ROOT = Path(mainspring.__file__).parent


def test_the_package_keeps_its_layers() -> None:
    found = check(ROOT)
    assert not found, "\n".join(map(str, found))


def _plant(tmp_path: Path, files: dict[str, str]) -> list[Violation]:
    root = tmp_path / "mainspring"
    base = {
        "__init__.py": "",
        "_errors.py": "class E(Exception):\n    pass\n",
        "storage/__init__.py": "from ._base import Store\nfrom ._base import Cursor as Cursor\n"
        '__all__ = ["Store"]\n__internal__ = ("Cursor",)\n',
        "storage/_base.py": "class Store:\n    def _write(self) -> None: ...\n"
        "class Cursor:\n    pass\n",
        "journal/__init__.py": "from ._context import RunContext\n",
        "journal/_context.py": "from ..storage import Store\nclass RunContext:\n    pass\n",
        "server/__init__.py": "",
    }
    for name, text in {**base, **files}.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return check(root)


def test_a_clean_package_passes(tmp_path: Path) -> None:
    assert _plant(tmp_path, {}) == []


def test_floors_use_internal_names_and_their_own_privates(tmp_path: Path) -> None:
    """A floor may take an internal name; a private name spelled like another part's
    is the reader's own where its receiver is shown to be one of its classes."""
    found = _plant(
        tmp_path,
        {
            "journal/_x.py": "from ..storage import Cursor\n"
            "class Mine:\n    def __init__(self) -> None:\n        self._write = 1\n"
            "    def go(self) -> int:\n        return self._write\n"
            "def f(mine: Mine) -> int:\n    return mine._write\n"
            "def g() -> int:\n    made = Mine()\n    return made._write\n",
        },
    )
    assert found == []


@pytest.mark.parametrize(
    ("files", "rule", "says"),
    [
        pytest.param(
            {"storage/_up.py": "from ..journal import RunContext\n"},
            "layer", "storage imports journal", id="upward-import",
        ),
        pytest.param(
            {"storage/_up.py": "from typing import TYPE_CHECKING\n"
             "if TYPE_CHECKING:\n    from ..journal import RunContext\n"},
            "layer", "for types only", id="upward-import-for-types",
        ),
        pytest.param(
            {"journal/_x.py": "def f():\n    from ..storage import Store\n"},
            "lazy", "inside a function", id="import-in-function",
        ),
        pytest.param(
            {"journal/_x.py": "from ..storage._base import Store\n"},
            "private", "private module mainspring.storage._base", id="private-module",
        ),
        pytest.param(
            {"journal/_x.py": "from ..storage import _hidden\n"},
            "private", "imports _hidden", id="private-name",
        ),
        pytest.param(
            {"journal/_x.py": "def f(store):\n    return store._write()\n"},
            "private", "store._write", id="private-attribute",
        ),
        pytest.param(
            {"journal/_x.py": "from ..storage import Store\n"
             "def _write() -> None: ...\n"
             "def f(store: Store) -> None:\n    store._write()\n"},
            "private", "store._write", id="private-attribute-spelled-like-our-own",
        ),
        pytest.param(
            {"journal/_x.py": "def _write() -> None: ...\n"
             "def f(store) -> None:\n    store._write()\n"},
            "private", "store._write", id="private-attribute-of-an-unknown-receiver",
        ),
        pytest.param(
            {"journal/_x.py": "from ..storage import Store\n"
             "class Mine(Store):\n    def _write(self) -> None: ...\n"
             "class Theirs(Store):\n    def go(self) -> None:\n        self._write()\n"},
            "private", "self._write", id="private-attribute-inherited-from-another-part",
        ),
        pytest.param(
            {"server/_x.py": "from ..storage import Cursor\n"},
            "internal", "mainspring.storage.Cursor, internal to floors", id="edge-uses-internal",
        ),
        pytest.param(
            {"server/_x.py": "import mainspring as ms\nx = ms.storage.Cursor\n"},
            "internal", "mainspring.storage.Cursor", id="edge-uses-internal-by-attribute",
        ),
        pytest.param(
            {"journal/_x.py": "from ..storage import Hidden\n",
             "storage/_base.py": "class Store:\n    pass\nclass Cursor:\n    pass\n"
             "class Hidden:\n    pass\n"},
            "exports", "does not export", id="name-not-exported",
        ),
        pytest.param(
            {"storage/__init__.py": "from ._base import Store\n"
             '__all__ = ["Store"]\n__internal__ = ("Store",)\n'},
            "exports", "as public and internal", id="name-both-public-and-internal",
        ),
        pytest.param(
            {"storage/__init__.py": "from ._base import Store\n"
             '__all__ = ["Store"]\n__internal__ = ("Cursor",)\n'},
            "exports", "never binds it", id="internal-name-not-bound",
        ),
        pytest.param(
            {"server/_x.py": "from .._errors import E\n"},
            "private", "private module mainspring._errors", id="edge-uses-kernel",
        ),
        pytest.param(
            {"journal/_big.py": "x = 1\n" * 801},
            "size", "801 lines", id="module-too-long",
        ),
    ],
)  # fmt: skip
def test_a_planted_violation_is_caught(
    tmp_path: Path, files: dict[str, str], rule: str, says: str
) -> None:
    found = _plant(tmp_path, files)
    assert [v.rule for v in found] == [rule], found
    assert says in found[0].what


def test_every_part_has_a_rank() -> None:
    packages = [p for p in ROOT.iterdir() if (p / "__init__.py").exists()]
    modules = [p for p in ROOT.glob("*.py")]
    parts = {part_of(f"mainspring.{p.stem}") for p in [*packages, *modules]}
    assert parts <= set(RANKS)


# What each public subpackage exports, pinned: a change here is a change of the API.
PUBLIC: dict[str, list[str]] = json.loads(
    (Path(__file__).parent / "data" / "public_exports.json").read_text()
)


@pytest.mark.parametrize("package", sorted(PUBLIC))
def test_public_subpackage_exports_are_pinned(package: str) -> None:
    module = importlib.import_module(f"mainspring.{package}")
    assert sorted(module.__all__) == PUBLIC[package]
    internal = getattr(module, "__internal__", ())
    assert not set(internal) & set(module.__all__)
    for name in [*module.__all__, *internal]:
        assert hasattr(module, name), f"mainspring.{package}.{name}"
