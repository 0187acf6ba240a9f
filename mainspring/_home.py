"""Where users import a name from, as its ``__module__`` says.

A class lives in a private module (``mainspring._app._core``) but users import it from
a public one (``mainspring``). Reprs, tracebacks, documentation tools and ``pickle`` read
``__module__``; after :func:`publish` they name the public home (``mainspring.App``), as
httpx does for ``httpx.Client``. ``pickle`` finds the object again by that module and
``__qualname__``, so only a name exported under its own ``__name__`` is moved.

Two kinds of export keep their defining module:

- exception classes: the journal records an error's type as ``module.qualname`` and
  replay compares it (``call_model`` tells a 429 from a failure by it), so the recorded
  name of an error never changes under journals already written;
- classes whose annotations would not resolve in the public module (``typing`` and
  pydantic evaluate a class's string annotations in the namespace of its
  ``__module__``; a dataclass that names a private helper type must stay where it is).
"""

from __future__ import annotations

import inspect
import sys
import typing
from collections.abc import Iterable

__all__ = ["publish"]


def publish(module: str, names: Iterable[str]) -> None:
    """Give each exported class or function of ``module`` that names one of its
    submodules as its home (``mainspring.storage.sqlite``) the public ``module``
    (``mainspring.storage``). The first public home wins: ``mainspring`` publishes its
    own names before its floors'."""
    namespace = vars(sys.modules[module])
    for name in names:
        obj = namespace.get(name)
        if not (inspect.isfunction(obj) or isinstance(obj, type)):
            continue
        home = getattr(obj, "__module__", "")
        if obj.__name__ != name or obj.__qualname__ != name or not home.startswith(module + "."):
            continue
        obj.__module__ = module
        if isinstance(obj, type) and not _movable(obj):
            obj.__module__ = home


def _movable(cls: type) -> bool:
    """Whether ``cls``, its ``__module__`` already moved, still reads its annotations."""
    if issubclass(cls, BaseException):
        return False
    try:
        typing.get_type_hints(cls)
    except Exception:  # a name only the defining module knows (or a hint typing cannot read)
        return False
    return True
