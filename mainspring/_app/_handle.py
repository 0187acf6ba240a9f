"""``RunHandle``: what submitting a run returns."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._core import App

__all__ = ["RunHandle"]


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
