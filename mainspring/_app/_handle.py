"""``RunHandle``: what submitting a run returns."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, overload

if TYPE_CHECKING:
    from ._core import App

__all__ = ["RunHandle", "run_id_of"]


@dataclass(frozen=True, slots=True)
class RunHandle:
    """A submitted run. ``created`` is False when an existing run had the same key."""

    app: App
    run_id: str
    created: bool

    def status(self) -> str:
        return self.app.get_run(self.run_id).status

    async def result(self, *, timeout: float | None = None) -> Any:
        """Wait for the run to finish (executed by some worker) and return its result."""
        return await self.app.result(self.run_id, timeout=timeout)


@overload
def run_id_of(run: str | RunHandle) -> str: ...
@overload
def run_id_of(run: str | RunHandle | None) -> str | None: ...
def run_id_of(run: str | RunHandle | None) -> str | None:
    """The run id of a run id or of a :class:`RunHandle` (what ``submit`` returned):
    every App method that takes a run takes either. Anything else is a ``TypeError``
    that names what was passed, not a database error."""
    if run is None or isinstance(run, str):
        return run
    if isinstance(run, RunHandle):
        return run.run_id
    raise TypeError(
        f"a run is named by its id (a str) or by the RunHandle submit returned, "
        f"not by {type(run).__name__} {run!r:.80}"
    )
