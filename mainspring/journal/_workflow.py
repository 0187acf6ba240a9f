"""A registered workflow: a name, an async function and its argument codec."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Generic, ParamSpec, TypeVar, get_type_hints

from .._errors import ConfigError
from .._serde import dumps, loads, revive

__all__ = ["Workflow"]

P = ParamSpec("P")
R = TypeVar("R")


@dataclass(frozen=True, eq=False)
class Workflow(Generic[P, R]):
    """A workflow registered with an :class:`App`. Run it with ``app.run`` or
    ``app.submit``; its function takes a :class:`RunContext` first."""

    name: str
    fn: Callable[..., Awaitable[R]]
    _signature: inspect.Signature = field(repr=False)
    _hints: dict[str, Any] = field(repr=False)

    @classmethod
    def create(cls, fn: Callable[..., Awaitable[R]], name: str | None = None) -> Workflow[P, R]:
        if not inspect.iscoroutinefunction(fn):
            raise ConfigError(
                f"workflow {getattr(fn, '__qualname__', fn)!r} must be an `async def` "
                "function taking a RunContext first"
            )
        signature = inspect.signature(fn)
        if not signature.parameters:
            raise ConfigError(
                f"workflow {fn.__qualname__!r} must take a RunContext as its first parameter"
            )
        try:
            hints = get_type_hints(fn)
        except Exception:
            hints = {}
        return cls(name or fn.__name__, fn, signature, hints)

    def encode_input(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        """Check the arguments against the signature and encode them as JSON."""
        try:
            self._signature.bind(None, *args, **kwargs)
        except TypeError as exc:
            raise ConfigError(
                f"workflow {self.name!r} cannot take args={args!r} kwargs={kwargs!r}: {exc}"
            ) from None
        encoded = dumps({"args": list(args), "kwargs": kwargs}, what=f"input of {self.name!r}")
        self.decode_input(encoded)  # wrong types fail here, not later in a worker
        return encoded

    def decode_input(self, text: str) -> tuple[list[Any], dict[str, Any]]:
        """Decode journaled input, reviving each argument to its annotated type."""
        data = loads(text)
        args, kwargs = list(data.get("args", [])), dict(data.get("kwargs", {}))
        params = list(self._signature.parameters.values())[1:]
        for i, value in enumerate(args):
            if i < len(params) and params[i].kind in (
                inspect.Parameter.POSITIONAL_ONLY,
                inspect.Parameter.POSITIONAL_OR_KEYWORD,
            ):
                args[i] = self._revive(params[i].name, value)
        for key, value in kwargs.items():
            if key in self._signature.parameters:
                kwargs[key] = self._revive(key, value)
        return args, kwargs

    def decode_output(self, text: str | None) -> R:
        value: R = revive(
            loads(text), self._hints.get("return", Any), what=f"result of {self.name!r}"
        )
        return value

    def _revive(self, param: str, value: Any) -> Any:
        tp = self._hints.get(param, Any)
        return revive(value, tp, what=f"argument {param!r} of workflow {self.name!r}")
